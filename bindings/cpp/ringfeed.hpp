// ringfeed.hpp — header-only C++17 wrapper over the C ABI in ringfeed.h.
//
// Conventions (the same for every class here; the C rules underneath are at
// the top of ringfeed.h):
//
// - Errors are exceptions. A failing C call throws ringfeed::Error, which
//   carries the status code (status()) and the library's message
//   (message(), from ringfeed_last_error on the calling thread). The
//   ordinary outcomes of Loader::next (a batch, end of epoch, time-out,
//   finished) are values, never exceptions.
// - Ownership. A Loader owns one loader handle and a Batch owns one batch
//   lease; both are move-only, and a moved-from object is empty. Destructors
//   never throw: ~Loader closes the loader, ~Batch releases the lease, and
//   an error there is dropped because a destructor cannot report it; call
//   Loader::close() or Batch::release() to see it.
// - Views. Sample, Field, Bytes and the std::string_views they hand out point
//   into memory the library owns for their batch. They stay valid until that
//   batch is released (Batch::release() or ~Batch); moving the Batch does not
//   invalidate them. Copy what you need to keep longer.
// - A Batch may outlive its Loader: its bytes stay valid until it is released.
// - Threads. next(), stats() and stats_json() may be called from several
//   threads on one Loader, and close() may be called while other threads wait
//   in next(): they then throw Error with RINGFEED_ERR_CLOSED (or
//   RINGFEED_ERR_INVALID_HANDLE if they call after the close). Moving,
//   assigning or destroying a Loader must not race with other calls on it.
//   One Batch is used by one thread at a time.
// - Do not use a Loader across fork(): open it in the process that uses it.
// - Whole objects. Object owns an object read whole into the library's
//   memory (released by ~Object or release()); ObjectWriter owns a write in
//   progress: ~ObjectWriter aborts a write not finished, so nothing of it
//   is left; finish() makes the object visible. Both are move-only. A
//   configuration is the loader's JSON keys without "urls" (part_size,
//   parts_in_flight, checksum, overwrite, s3_*, aws_*); "{}" or "" for the
//   defaults. A child of fork() may read and release its copy of an
//   Object; its calls on the parent's ObjectWriter throw
//   RINGFEED_ERR_INVALID_HANDLE (and its destructor there does nothing).

#ifndef RINGFEED_HPP
#define RINGFEED_HPP

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "ringfeed.h"

namespace ringfeed {

// A failed call: the status code and the library's message.
class Error : public std::runtime_error {
 public:
  Error(std::int32_t status, const std::string& message)
      : std::runtime_error(std::string(ringfeed_status_name(status)) + ": " + message),
        status_(status),
        prefix_(std::char_traits<char>::length(ringfeed_status_name(status)) + 2) {}

  // One of the RINGFEED_ERR_* codes.
  std::int32_t status() const noexcept { return status_; }
  // The library's message, without the status name that what() begins with.
  std::string_view message() const noexcept { return std::string_view(what()).substr(prefix_); }

 private:
  std::int32_t status_;
  std::size_t prefix_;
};

namespace detail {

// The calling thread's last error message.
inline std::string last_error() {
  char small[512];
  std::size_t n = ringfeed_last_error(small, sizeof small);
  if (n < sizeof small) {
    return std::string(small, n);
  }
  std::string message(n + 1, '\0');
  ringfeed_last_error(&message[0], message.size());
  message.resize(n);
  return message;
}

[[noreturn]] inline void fail(std::int32_t status) { throw Error(status, last_error()); }

// Throws for an error status; passes the others through.
inline std::int32_t check(std::int32_t status) {
  if (status < 0) {
    fail(status);
  }
  return status;
}

// Iterates an array of `Raw` C structs, making a `View` of each on the fly.
template <typename View, typename Raw>
class Iter {
 public:
  // Input, not forward: a dereference makes a view, not a reference.
  using iterator_category = std::input_iterator_tag;
  using value_type = View;
  using difference_type = std::ptrdiff_t;
  using pointer = void;
  using reference = View;

  Iter() noexcept = default;
  explicit Iter(const Raw* p) noexcept : p_(p) {}

  View operator*() const noexcept { return View(*p_); }
  Iter& operator++() noexcept {
    ++p_;
    return *this;
  }
  Iter operator++(int) noexcept {
    Iter old = *this;
    ++p_;
    return old;
  }
  friend bool operator==(Iter a, Iter b) noexcept { return a.p_ == b.p_; }
  friend bool operator!=(Iter a, Iter b) noexcept { return a.p_ != b.p_; }

 private:
  const Raw* p_ = nullptr;
};

}  // namespace detail

// A read-only run of bytes owned by the library (see "Views" above).
class Bytes {
 public:
  Bytes() noexcept = default;
  Bytes(const std::uint8_t* data, std::size_t size) noexcept : data_(data), size_(size) {}

  const std::uint8_t* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  const std::uint8_t* begin() const noexcept { return data_; }
  const std::uint8_t* end() const noexcept { return data_ + size_; }
  std::uint8_t operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// One field of a sample: its name ("jpg") and its bytes.
class Field {
 public:
  explicit Field(const ringfeed_field& raw) noexcept : raw_(&raw) {}

  std::string_view name() const noexcept { return raw_->name; }
  Bytes data() const noexcept { return Bytes(raw_->data, raw_->len); }
  std::size_t size() const noexcept { return raw_->len; }
  const ringfeed_field& raw() const noexcept { return *raw_; }

 private:
  const ringfeed_field* raw_;
};

// One sample: its key and its fields, in the order of the shard.
class Sample {
 public:
  using iterator = detail::Iter<Field, ringfeed_field>;

  explicit Sample(const ringfeed_sample& raw) noexcept : raw_(&raw) {}

  std::string_view key() const noexcept { return raw_->key; }
  std::size_t size() const noexcept { return raw_->field_count; }
  iterator begin() const noexcept { return iterator(raw_->fields); }
  iterator end() const noexcept { return iterator(raw_->fields + raw_->field_count); }
  Field operator[](std::size_t i) const noexcept { return Field(raw_->fields[i]); }

  // The field named `name`, if the sample has one.
  std::optional<Field> field(std::string_view name) const noexcept {
    for (Field f : *this) {
      if (f.name() == name) {
        return f;
      }
    }
    return std::nullopt;
  }

  const ringfeed_sample& raw() const noexcept { return *raw_; }

 private:
  const ringfeed_sample* raw_;
};

// A lease on one batch of samples. Releases it on destruction.
class Batch {
 public:
  using iterator = detail::Iter<Sample, ringfeed_sample>;

  // An empty batch, holding no lease.
  Batch() noexcept = default;
  ~Batch() { drop(); }

  Batch(Batch&& other) noexcept : raw_(std::exchange(other.raw_, ringfeed_batch{})) {}
  Batch& operator=(Batch&& other) noexcept {
    if (this != &other) {
      drop();
      raw_ = std::exchange(other.raw_, ringfeed_batch{});
    }
    return *this;
  }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Releases the lease now: every view into the batch becomes invalid. Does
  // nothing on an empty batch; throws Error if the library refuses.
  void release() {
    if (raw_.handle == 0) {
      return;
    }
    ringfeed_batch lease = std::exchange(raw_, ringfeed_batch{});
    detail::check(ringfeed_batch_release(&lease));
  }

  // Whether this object holds a lease.
  bool valid() const noexcept { return raw_.handle != 0; }
  explicit operator bool() const noexcept { return valid(); }

  std::uint64_t epoch() const noexcept { return raw_.epoch; }
  std::uint64_t index() const noexcept { return raw_.index; }
  // Payload bytes in all fields.
  std::uint64_t bytes() const noexcept { return raw_.bytes; }
  // Samples in the batch (0 when empty).
  std::size_t size() const noexcept { return raw_.sample_count; }
  bool empty() const noexcept { return raw_.sample_count == 0; }
  iterator begin() const noexcept { return iterator(raw_.samples); }
  iterator end() const noexcept { return iterator(raw_.samples + raw_.sample_count); }
  Sample operator[](std::size_t i) const noexcept { return Sample(raw_.samples[i]); }

  // The C view; its handle is 0 when empty.
  const ringfeed_batch& raw() const noexcept { return raw_; }

 private:
  friend class Loader;
  explicit Batch(const ringfeed_batch& raw) noexcept : raw_(raw) {}

  void drop() noexcept {
    if (raw_.handle != 0) {
      // Nothing to do with an error here (see "Ownership" above).
      (void)ringfeed_batch_release(&raw_);
      raw_ = ringfeed_batch{};
    }
  }

  ringfeed_batch raw_{};
};

// What Loader::next returns: a batch, or why there is none. Use like a
// std::optional<Batch>: `if (auto n = loader.next(t)) use(*n);`.
class Next {
 public:
  enum class Kind { batch, end_of_epoch, timeout, finished };

  Kind kind() const noexcept { return kind_; }
  bool has_value() const noexcept { return kind_ == Kind::batch; }
  explicit operator bool() const noexcept { return has_value(); }
  // Every batch of the current epoch was handed out; the next epoch follows.
  bool end_of_epoch() const noexcept { return kind_ == Kind::end_of_epoch; }
  // No batch arrived within the time-out.
  bool timed_out() const noexcept { return kind_ == Kind::timeout; }
  // Every epoch is over; no batch will come.
  bool finished() const noexcept { return kind_ == Kind::finished; }

  // The batch; throws std::bad_optional_access when there is none.
  Batch& value() & {
    if (!has_value()) {
      throw std::bad_optional_access();
    }
    return batch_;
  }
  Batch&& value() && { return std::move(value()); }
  Batch& operator*() & noexcept { return batch_; }
  Batch&& operator*() && noexcept { return std::move(batch_); }
  Batch* operator->() noexcept { return &batch_; }
  const Batch* operator->() const noexcept { return &batch_; }

 private:
  friend class Loader;
  Next(Kind kind, Batch batch) noexcept : kind_(kind), batch_(std::move(batch)) {}

  Kind kind_;
  Batch batch_;
};

// The counters and setup of a loader (see ringfeed.h).
using Stats = ringfeed_stats;

// An open loader.
class Loader {
 public:
  // Opens a loader from a JSON configuration; throws Error on failure.
  explicit Loader(const char* config_json) : handle_(open(config_json)) {}
  explicit Loader(const std::string& config_json) : Loader(config_json.c_str()) {}

  ~Loader() { drop(); }

  Loader(Loader&& other) noexcept
      : handle_(std::move(other.handle_)), closed_(other.closed_.exchange(false)) {}
  Loader& operator=(Loader&& other) noexcept {
    if (this != &other) {
      drop();
      handle_ = std::move(other.handle_);
      closed_ = other.closed_.exchange(false);
    }
    return *this;
  }
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Waits up to `timeout` (negative: for ever; 0: not at all) for the next
  // batch. Throws Error on failure, including a failure of a worker (a
  // corrupt shard), which every later call reports again.
  Next next(std::chrono::milliseconds timeout) {
    ringfeed_batch raw{};
    std::int32_t status = detail::check(
        ringfeed_loader_next(handle_.get(), static_cast<std::int64_t>(timeout.count()), &raw));
    switch (status) {
      case RINGFEED_OK:
        return Next(Next::Kind::batch, Batch(raw));
      case RINGFEED_END_OF_EPOCH:
        return Next(Next::Kind::end_of_epoch, Batch());
      case RINGFEED_TIMEOUT:
        return Next(Next::Kind::timeout, Batch());
      case RINGFEED_FINISHED:
        return Next(Next::Kind::finished, Batch());
      default:
        throw Error(status, "ringfeed_loader_next returned an unknown status");
    }
  }

  // Waits for ever: a batch, the end of an epoch, or finished.
  Next next() { return next(std::chrono::milliseconds(-1)); }

  Stats stats() const {
    Stats s{};
    s.size = sizeof s;
    detail::check(ringfeed_loader_stats(handle_.get(), &s));
    return s;
  }

  // The stats as a JSON object, with the setup notes.
  std::string stats_json() const { return text_of(ringfeed_loader_stats_json, 1024); }

  // The resume state after the batches handed out so far: an opaque ASCII
  // string to give back as the configuration's "resume" value (or one of an
  // array of them, for an elastic resume). See docs/epochs.md. About
  // 150 bytes; more after elastic resumes (the buffer grows).
  std::string state() const { return text_of(ringfeed_loader_state, 256); }

  // Stops the loader. Threads waiting in next() throw Error
  // (RINGFEED_ERR_CLOSED); later calls throw RINGFEED_ERR_INVALID_HANDLE.
  // Batches still held stay valid. Closing again does nothing.
  void close() {
    if (handle_ && !closed_.exchange(true)) {
      detail::check(ringfeed_loader_close(handle_.get()));
    }
  }

  // The C handle, for calls this wrapper does not cover; NULL when moved from.
  ringfeed_loader* get() const noexcept { return handle_.get(); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

 private:
  // Calls a `ringfeed_loader_*` text function (the NUL-terminated buffer
  // protocol), growing the buffer when the text grew in between.
  template <typename Fn>
  std::string text_of(Fn fn, std::size_t size) const {
    std::string text(size, '\0');
    for (;;) {
      std::size_t needed = 0;
      std::int32_t status = fn(handle_.get(), &text[0], text.size(), &needed);
      if (status == RINGFEED_OK) {
        text.resize(needed);
        return text;
      }
      if (status != RINGFEED_ERR_BUFFER_TOO_SMALL) {
        detail::fail(status);
      }
      text.resize(needed + 64);
    }
  }

  struct Closer {
    void operator()(ringfeed_loader* loader) const noexcept { (void)ringfeed_loader_close(loader); }
  };

  static ringfeed_loader* open(const char* config_json) {
    ringfeed_loader* loader = nullptr;
    detail::check(ringfeed_loader_open(config_json, &loader));
    return loader;
  }

  // Closes the handle unless close() already did; leaves this empty.
  void drop() noexcept {
    if (closed_.exchange(false)) {
      (void)handle_.release();  // closed already: the number is dead
    }
    handle_.reset();
  }

  // The handle stays in place after close() (the library answers a closed
  // handle with an error, never a crash), so threads in next() may keep
  // reading it while another thread closes.
  std::unique_ptr<ringfeed_loader, Closer> handle_;
  std::atomic<bool> closed_{false};
};

namespace detail {

// NULL for an empty configuration: the library's defaults.
inline const char* config_or_null(const std::string& config) noexcept {
  return config.empty() ? nullptr : config.c_str();
}

}  // namespace detail

// An object read whole into the library's memory: its bytes stay put until
// it is released, so views of them need no copy. Move-only.
class Object {
 public:
  Object() noexcept = default;

  // Reads the whole object at `url` (s3://bucket/key, http(s)://..., a
  // local path or file:// URL), with `parts_in_flight` ranged reads of
  // `part_size` in flight. Throws Error on failure.
  static Object read(const std::string& url, const std::string& config = "{}") {
    ringfeed_object* handle = nullptr;
    detail::check(ringfeed_object_read(url.c_str(), detail::config_or_null(config), &handle));
    Object o;
    o.handle_ = handle;
    detail::check(ringfeed_object_data(handle, &o.data_, &o.size_));
    return o;
  }

  Object(Object&& other) noexcept { swap(other); }
  Object& operator=(Object&& other) noexcept {
    if (this != &other) {
      Object gone(std::move(other));
      swap(gone);
    }
    return *this;
  }
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;
  ~Object() {
    if (handle_ != nullptr) {
      (void)ringfeed_object_release(handle_);  // a destructor cannot report it
    }
  }

  // Frees the bytes now; throws Error if the library refuses. Nothing on an
  // empty Object.
  void release() {
    ringfeed_object* handle = handle_;
    handle_ = nullptr;
    data_ = nullptr;
    size_ = 0;
    if (handle != nullptr) {
      detail::check(ringfeed_object_release(handle));
    }
  }

  const std::uint8_t* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return static_cast<std::size_t>(size_); }
  bool empty() const noexcept { return size_ == 0; }
  const std::uint8_t* begin() const noexcept { return data_; }
  const std::uint8_t* end() const noexcept { return data_ + size_; }
  std::uint8_t operator[](std::size_t i) const noexcept { return data_[i]; }
  Bytes bytes() const noexcept { return Bytes(data_, size()); }
  // Holds an object (not moved from or released).
  explicit operator bool() const noexcept { return handle_ != nullptr; }

 private:
  void swap(Object& other) noexcept {
    std::swap(handle_, other.handle_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }

  ringfeed_object* handle_ = nullptr;
  const std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// The size of the object at `url`, without reading it.
inline std::uint64_t object_size(const std::string& url, const std::string& config = "{}") {
  std::uint64_t size = 0;
  std::int32_t status =
      ringfeed_object_read_into(url.c_str(), detail::config_or_null(config), nullptr, 0, &size);
  if (status != RINGFEED_OK && status != RINGFEED_ERR_BUFFER_TOO_SMALL) {
    detail::fail(status);
  }
  return size;
}

// Reads the whole object at `url` into `buf` (`len` bytes) and returns its
// size. A buffer smaller than the object throws Error with
// RINGFEED_ERR_BUFFER_TOO_SMALL before any byte is read.
inline std::uint64_t read_into(const std::string& url, void* buf, std::size_t len,
                               const std::string& config = "{}") {
  std::uint64_t size = 0;
  detail::check(ringfeed_object_read_into(url.c_str(), detail::config_or_null(config),
                                          static_cast<std::uint8_t*>(buf), len, &size));
  return size;
}

// Writes `len` bytes at `data` as the object at `url` (s3://bucket/key, a
// local path or file:// URL), visible only once whole. An existing object
// throws Error with RINGFEED_ERR_EXISTS unless the configuration has
// "overwrite": true.
inline void write_object(const std::string& url, const void* data, std::size_t len,
                         const std::string& config = "{}") {
  detail::check(ringfeed_object_write(url.c_str(), detail::config_or_null(config),
                                      static_cast<const std::uint8_t*>(data), len));
}

// An object being written, piece by piece. Move-only; destroyed (or moved
// over) before finish(), it aborts: nothing of the object is left.
class ObjectWriter {
 public:
  ObjectWriter() noexcept = default;

  // Starts the object at `url`; throws Error (RINGFEED_ERR_EXISTS for an
  // object that exists, unless "overwrite" is true).
  explicit ObjectWriter(const std::string& url, const std::string& config = "{}") {
    detail::check(ringfeed_writer_open(url.c_str(), detail::config_or_null(config), &handle_));
  }

  ObjectWriter(ObjectWriter&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  ObjectWriter& operator=(ObjectWriter&& other) noexcept {
    if (this != &other) {
      drop();
      handle_ = other.handle_;
      other.handle_ = nullptr;
    }
    return *this;
  }
  ObjectWriter(const ObjectWriter&) = delete;
  ObjectWriter& operator=(const ObjectWriter&) = delete;
  ~ObjectWriter() { drop(); }

  // Appends `len` bytes at `data`. Throws Error; after an error the write
  // is aborted and every later call throws it again.
  void write(const void* data, std::size_t len) {
    detail::check(ringfeed_writer_write(handle_, static_cast<const std::uint8_t*>(data), len));
  }
  void write(std::string_view text) { write(text.data(), text.size()); }

  // Makes the object visible, whole; the writer is empty after, whatever
  // happens. Throws Error (nothing is kept then).
  void finish() {
    ringfeed_writer* handle = handle_;
    handle_ = nullptr;
    detail::check(ringfeed_writer_finish(handle));
  }

  // Drops what was written; the writer is empty after. Throws Error if the
  // library refuses (an S3 abort that failed).
  void abort() {
    ringfeed_writer* handle = handle_;
    handle_ = nullptr;
    if (handle != nullptr) {
      detail::check(ringfeed_writer_abort(handle));
    }
  }

  // Holds a write in progress (not finished, aborted or moved from).
  explicit operator bool() const noexcept { return handle_ != nullptr; }

 private:
  void drop() noexcept {
    if (handle_ != nullptr) {
      (void)ringfeed_writer_abort(handle_);  // a destructor cannot report it
      handle_ = nullptr;
    }
  }

  ringfeed_writer* handle_ = nullptr;
};

// The library version, such as "0.1.0".
inline std::string_view version() noexcept { return ringfeed_version(); }

// The name of a status code, such as "RINGFEED_ERR_CONFIG".
inline std::string_view status_name(std::int32_t status) noexcept {
  return ringfeed_status_name(status);
}

}  // namespace ringfeed

#endif  // RINGFEED_HPP
