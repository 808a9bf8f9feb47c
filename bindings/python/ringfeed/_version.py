"""The release this package belongs to: the `version` of the repository's
Cargo.toml. The package loads only a native library of the same release
(`_lib.check_version`); setup.py refuses to build when this and Cargo.toml
differ, and tests/test_package.py checks them too."""

VERSION = "0.2.0"
