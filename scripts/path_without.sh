#!/usr/bin/env bash
# Makes DIR a directory of links to every program on the current PATH but
# the ones named, the first of each name as the shell would find it, so
# that `PATH=DIR` is this machine without those programs:
#
#   scripts/path_without.sh DIR PROGRAM...
#
# For instance, a build as on a machine without CMake and nasm:
#
#   scripts/path_without.sh /tmp/bare cmake nasm && PATH=/tmp/bare cargo build
#
# A stub that fails would not do: a build script may only look at how
# `nasm -v` exits, or whether the program is there at all. scripts/test.sh
# builds the library's lints and tests this way without CMake and nasm.
# Exits non-zero when one of the programs can still be found there.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 DIR PROGRAM..." >&2
    exit 2
fi
dir=$1
shift
rm -rf "$dir"
mkdir -p "$dir"
IFS=: read -r -a path_dirs <<<"$PATH"
for from in "${path_dirs[@]}"; do
    # Only absolute entries: a link to a relative one would point elsewhere.
    case "$from" in /*) ;; *) continue ;; esac
    for prog in "$from"/*; do
        name=${prog##*/}
        for left_out in "$@"; do
            [ "$name" != "$left_out" ] || continue 2
        done
        if [ -f "$prog" ] && [ -x "$prog" ] && [ ! -e "$dir/$name" ] && [ ! -L "$dir/$name" ]; then
            ln -s "$prog" "$dir/$name"
        fi
    done
done
for left_out in "$@"; do
    if found=$(PATH=$dir command -v "$left_out"); then
        echo "$0: $found is still on the PATH meant to be without $left_out" >&2
        exit 1
    fi
done
