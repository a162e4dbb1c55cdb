#!/usr/bin/env bash
# Cold Engine() start-ups (empty Triton cache each, spawn to ready: startup_profile.engine_start) under the device
# image's transformers stack and under the one a fresh install resolves today (.whl_tf: transformers, tokenizers,
# huggingface-hub and what they need, at the versions of this machine's .venv), ABBA. Issue 56's cold start-up.
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl_tf transformers==V ...
#   bash benchmarks/lease/startup_env_ab.sh      # carry [".whl", ".whl_tf"]; ~3 min
. benchmarks/lib/env.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_tf .whl_tf/*.whl || exit 1
python3 - <<'PY'
import json, os, shutil, sys, tempfile, statistics, subprocess
from pathlib import Path
sys.path.insert(0, '.')
from benchmarks.startup import startup_profile as sp
base = os.environ["PYTHONPATH"]
envs = {"image": base, "fresh_install": "/tmp/site_tf:" + base}
rows = []
for r in range(2):
    for name, pp in (envs.items() if r == 0 else reversed(list(envs.items()))):
        os.environ["PYTHONPATH"] = pp
        probe = ("import transformers as t, tokenizers as k, huggingface_hub as h; "
                 "print(t.__version__, k.__version__, h.__version__)")
        ver = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
        cache = tempfile.mkdtemp(prefix="triton_cold_")
        row = {"env": name, "versions": ver, "round": r + 1, **sp.engine_start(Path('.').resolve(), cache)}
        shutil.rmtree(cache, ignore_errors=True)
        print(json.dumps(row), flush=True)
        rows.append(row)
out = {"benchmark": "startup_transformers_ab", "cache": "cold", "starts": rows}
for name in envs:
    rs = [x for x in rows if x["env"] == name]
    out[name] = {k: statistics.median(x[k] for x in rs) for k in ("imports_s", "engine_s", "ready_s")}
    print(name, out[name], flush=True)
Path(os.environ["OUT"], "startup_transformers_ab.json").write_text(json.dumps(out, indent=1) + "\n")
PY
