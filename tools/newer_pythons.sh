#!/usr/bin/env bash
# The core's fast subset (hatch environment "newer": async actors' tasks, TLS checks, pdb)
# on Python 3.12 and 3.13, which the packages claim (requires-python >= 3.11) while the
# suite runs on 3.11. Interpreters pyenv installed are used (their folders go first on
# PATH: pyenv's shims fail for a version that is not selected); else hatch finds or
# downloads one; where it can do neither, that version is skipped, saying so.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=$(command -v python3)  # hatch's own interpreter, before PATH changes
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
for dir in "$root"/versions/3.1[2-9]*/bin; do
    [[ -x "$dir/python3" ]] && PATH="$dir:$PATH"
done
export PATH
status=0
for version in 3.12 3.13; do
    if ! made=$("$python" -m hatch env create "newer.py$version" 2>&1); then
        echo "tools/newer_pythons.sh: no Python $version here (hatch could neither find nor download one): its subset is skipped" >&2
        tail -n 2 <<<"$made" >&2
        continue
    fi
    echo "+ Python $version: hatch run newer.py$version:test $*" >&2
    "$python" -m hatch run "newer.py$version:test" "$@" || status=1
done
exit "$status"
