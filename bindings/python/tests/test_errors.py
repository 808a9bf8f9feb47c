"""The exception classes against the status codes of the loaded library.

The library is asked for its statuses through `ringfeed_status_name` (every
code it names), so a status added in `src/ffi/status.rs` without its Python
class, or a class for a status the library dropped, fails here.
"""

import ringfeed
from ringfeed import _ffi, errors

UNKNOWN = "RINGFEED_UNKNOWN_STATUS"


def library_statuses():
    """{code: name} of every status the loaded library names."""
    out = {}
    for code in range(-1024, 1025):
        name = _ffi.lib.ringfeed_status_name(code).decode()
        if name != UNKNOWN:
            out[code] = name
    return out


def error_classes():
    """Every `ringfeed.Error` subclass the package defines."""
    seen, todo = [], [errors.Error]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("ringfeed.") and sub not in seen:
                seen.append(sub)
                todo.append(sub)
    return [c for c in seen if getattr(c, "status", None) is not None]


def test_the_library_names_the_statuses_python_declares():
    statuses = library_statuses()
    assert statuses[0] == "RINGFEED_OK"
    declared = {
        n: v
        for n, v in _ffi.CONSTANTS.items()
        # The header's other constants: stats fields' values, versions, log levels.
        if not n.startswith(("RINGFEED_MEMORY_", "RINGFEED_BACKEND_", "RINGFEED_VERSION_", "RINGFEED_ABI_", "RINGFEED_LOG_"))
    }
    assert declared == {name: code for code, name in statuses.items()}


def test_every_error_status_has_exactly_one_class():
    errs = {code: name for code, name in library_statuses().items() if code < 0}
    assert set(errors.BY_STATUS) == set(errs)
    classes = error_classes()
    for code, name in errs.items():
        claiming = [c for c in classes if c.status == code]
        # Several may carry a status (ReleasedError shares InvalidHandleError's),
        # but exactly one is the class the engine's status raises.
        raised = [c for c in claiming if errors.BY_STATUS[code] is c]
        assert len(raised) == 1, (name, claiming)
        cls = raised[0]
        assert issubclass(cls, ringfeed.Error)
        assert getattr(ringfeed, cls.__name__) is cls, f"{cls.__name__} is not exported"
        e = cls("message")
        assert e.status == code and e.status_name == name


def test_no_class_claims_a_status_the_library_lacks():
    errs = {code for code in library_statuses() if code < 0}
    classes = error_classes()
    assert classes, "no error classes found"
    for cls in classes:
        assert cls.status in errs, f"{cls.__name__} claims status {cls.status}"
    assert len(set(errors.BY_STATUS.values())) == len(errors.BY_STATUS)


def test_from_status_raises_the_registered_class():
    for code, cls in errors.BY_STATUS.items():
        e = errors.from_status(code, context="ctx")
        assert type(e) is cls and e.status == code and e.message.startswith("ctx")
    assert type(errors.from_status(-999)) is errors.Error


SECRETS = ("AKIAPYSECRETID", "PYSESSIONTOKEN", "PYSIGNATURE0123")
PRESIGNED = (
    "http://127.0.0.1:9/no-such.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    f"&X-Amz-Credential={SECRETS[0]}%2F20261201&X-Amz-Security-Token={SECRETS[1]}"
    f"&X-Amz-Signature={SECRETS[2]}"
)


def test_redact_takes_the_credentials_out_of_a_presigned_url():
    out = errors.redact(f"reading `{PRESIGNED}` failed")
    for s in SECRETS:
        assert s not in out, out
    assert "X-Amz-Signature=REDACTED`" in out and "no-such.tar?" in out, out
    assert errors.redact("s3://bucket/plain/key.tar") == "s3://bucket/plain/key.tar"


def test_errors_quoting_a_presigned_url_hold_none_of_its_secrets():
    # Nothing listens on port 9: the open fails naming the URL, which the
    # message does quote (the control), its secrets replaced.
    try:
        ringfeed.Loader([PRESIGNED], batch_size=4, max_attempts=1)
    except ringfeed.Error as e:
        message = str(e)
    else:
        raise AssertionError("a loader opened on a port nothing listens on")
    assert "no-such.tar?" in message and "REDACTED" in message, message
    for s in SECRETS:
        assert s not in message, message
    # The context a binding adds (a URL its caller gave) is redacted too.
    e = errors.from_status(_ffi.RINGFEED_ERR_IO, f"write {PRESIGNED}")
    for s in SECRETS:
        assert s not in str(e), str(e)
