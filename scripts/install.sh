#!/usr/bin/env bash
# Installs the C ABI and the CLI under a prefix, for C and C++ programs
# built with pkg-config or CMake:
#
#   scripts/install.sh --prefix /opt/ringfeed
#
#   PREFIX/lib/libringfeed.so.X.Y.Z, with libringfeed.so.MAJOR (the SONAME
#       build.rs gives it) and libringfeed.so linking to it
#   PREFIX/lib/libringfeed.a
#   PREFIX/include/ringfeed.h, PREFIX/include/ringfeed.hpp (the C++ wrapper)
#   PREFIX/lib/pkgconfig/ringfeed.pc
#   PREFIX/lib/cmake/ringfeed/ringfeedConfig.cmake and
#       ringfeedConfigVersion.cmake: the imported target ringfeed::ringfeed
#   PREFIX/bin/ringfeed, the CLI
#
# It runs `cargo build --release --locked` first (a no-op when the release
# build is current). CARGO_TARGET_DIR is honoured. DESTDIR is prepended to
# every path written, as packagers expect; the files name PREFIX only.
set -euo pipefail

usage() {
    echo "usage: $0 --prefix DIR" >&2
    exit 2
}

prefix=""
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        -h|--help) usage ;;
        *) echo "$0: unknown argument '$1'" >&2; usage ;;
    esac
done
[ -n "$prefix" ] || usage
case "$prefix" in
    /*) ;;
    *) prefix="$PWD/$prefix" ;;
esac

cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' Cargo.toml | head -n 1)
major=${version%%.*}
minor=${version#*.}
minor=${minor%%.*}
[ -n "$version" ] || { echo "$0: no version in Cargo.toml" >&2; exit 1; }

cargo build --release --locked
target=${CARGO_TARGET_DIR:-target}/release
for f in libringfeed.so libringfeed.a ringfeed; do
    [ -f "$target/$f" ] || { echo "$0: cargo built, but $target/$f is missing" >&2; exit 1; }
done

dest="${DESTDIR:-}$prefix"
install -d "$dest/lib/pkgconfig" "$dest/lib/cmake/ringfeed" "$dest/include" "$dest/bin"
install -m 755 "$target/libringfeed.so" "$dest/lib/libringfeed.so.$version"
ln -sfn "libringfeed.so.$version" "$dest/lib/libringfeed.so.$major"
ln -sfn "libringfeed.so.$major" "$dest/lib/libringfeed.so"
install -m 644 "$target/libringfeed.a" "$dest/lib/libringfeed.a"
install -m 644 include/ringfeed.h bindings/cpp/ringfeed.hpp "$dest/include/"
install -m 755 "$target/ringfeed" "$dest/bin/ringfeed"

# Libs.private: what a static link of libringfeed.a needs besides it, as
# `rustc --print native-static-libs` gives it for x86_64-unknown-linux-gnu.
cat > "$dest/lib/pkgconfig/ringfeed.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: ringfeed
Description: Data-loader engine for ML training (C ABI; C++17 wrapper ringfeed.hpp)
Version: $version
Libs: -L\${libdir} -lringfeed
Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
Cflags: -I\${includedir}
PC

# The CMake files find the prefix from where they lie, so an installed tree
# may be moved as a whole.
cat > "$dest/lib/cmake/ringfeed/ringfeedConfig.cmake" <<CMAKE
# ringfeed $version: find_package(ringfeed CONFIG) defines the imported
# target ringfeed::ringfeed, the shared library with its include directory
# (ringfeed.h, and the C++17 wrapper ringfeed.hpp).
get_filename_component(_ringfeed_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET ringfeed::ringfeed)
  add_library(ringfeed::ringfeed SHARED IMPORTED)
  set_target_properties(ringfeed::ringfeed PROPERTIES
    IMPORTED_LOCATION "\${_ringfeed_prefix}/lib/libringfeed.so.$version"
    IMPORTED_SONAME "libringfeed.so.$major"
    INTERFACE_INCLUDE_DIRECTORIES "\${_ringfeed_prefix}/include")
endif()
set(ringfeed_VERSION "$version")
unset(_ringfeed_prefix)
CMAKE

# Compatible: the same version, or a later one of the same major version;
# before 1.0 the same minor version too, since a 0.x minor release may
# change the ABI.
cat > "$dest/lib/cmake/ringfeed/ringfeedConfigVersion.cmake" <<CMAKE
set(PACKAGE_VERSION "$version")
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(NOT PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION
   AND PACKAGE_FIND_VERSION_MAJOR EQUAL $major
   AND (NOT $major EQUAL 0 OR PACKAGE_FIND_VERSION_MINOR EQUAL $minor))
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
# The library is 64-bit; a 32-bit project cannot use it. (A project with no
# compiled language has no pointer size to check.)
if(CMAKE_SIZEOF_VOID_P AND NOT CMAKE_SIZEOF_VOID_P STREQUAL "8")
  set(PACKAGE_VERSION "\${PACKAGE_VERSION} (64-bit)")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
CMAKE

echo "installed ringfeed $version under $dest"
