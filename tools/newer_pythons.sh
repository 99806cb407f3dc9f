#!/usr/bin/env bash
# The core's fast subset (hatch environment "newer": async actors' tasks, TLS checks, pdb)
# on Python 3.12 and 3.13, which the packages claim (requires-python >= 3.11) while the
# suite runs on 3.11. Interpreters pyenv installed are used (their folders go first on
# PATH: pyenv's shims fail for a version that is not selected); else hatch finds or
# downloads one; where it can do neither, that version is skipped, saying so.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=""  # an interpreter that has hatch (inside `hatch run`, python3 is the env's: it has not)
for candidate in $(type -ap python3) /usr/local/bin/python3 /usr/bin/python3; do
    if "$candidate" -m hatch --version >/dev/null 2>&1; then python=$candidate; break; fi
done
if [[ -z "$python" ]]; then
    echo "tools/newer_pythons.sh: no python3 with hatch found: the 3.12/3.13 subset is skipped" >&2
    exit 0
fi
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
