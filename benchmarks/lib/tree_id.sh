#!/usr/bin/env bash
# The tree a lease script measures: git's HEAD and a digest of radixlm/'s Python sources. On the device machine git's
# HEAD can name an older commit than the files sent (a call with 4c24050's files printed aedaae2, the session's first
# commit); the digest is of the files that ran. Run here at a commit to compare:
#   bash benchmarks/lib/tree_id.sh
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
digest=$(find radixlm -name '*.py' -print0 | LC_ALL=C sort -z | xargs -0 cat | sha1sum | cut -c1-12)
echo "tree $(git rev-parse --short HEAD 2>/dev/null || echo '?') radixlm sources $digest"
