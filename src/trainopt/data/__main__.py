"""``python -m trainopt.data [NAME]``: list the shipped files, or print one (to copy it).

Example: ``python -m trainopt.data hpo_digits.yaml > hpo_digits.yaml``.
"""

import sys

from trainopt.data import names, path

if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help")):
    print(__doc__.strip(), file=sys.stderr if len(sys.argv) > 2 else sys.stdout)
    sys.exit(2 if len(sys.argv) > 2 else 0)
if len(sys.argv) == 1:
    print("\n".join(names()))
    sys.exit(0)
try:
    target = path(sys.argv[1])
except FileNotFoundError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
if target.is_dir():
    print(f"error: name: {sys.argv[1]!r} is a folder; name one of its files", file=sys.stderr)
    sys.exit(2)
sys.stdout.write(target.read_text())
