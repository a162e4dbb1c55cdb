"""`python -m radixlm.router --worker-urls URL ... [router args]`: an alias of `radixlm router`."""
from __future__ import annotations

import sys

from radixlm.cli import main

if __name__ == "__main__":
    main(["router", *sys.argv[1:]])
