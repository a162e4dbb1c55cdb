"""`python -m radixlm.launch_server [--host H] [--port P] [server args...]`: an alias of `radixlm serve`."""
from __future__ import annotations

import sys

from radixlm.cli import main

if __name__ == "__main__":
    main(["serve", *sys.argv[1:]])
