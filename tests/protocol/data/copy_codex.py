"""Copy the Codex request bodies/frames from ../shared into codex_requests.jsonl."""

import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "../../../../shared/conformance/codex/cases")

with open(os.path.join(HERE, "codex_requests.jsonl"), "w") as out:
    for f in sorted(glob.glob(os.path.join(SRC, "*.server.jsonl"))):
        case = os.path.basename(f).split(".")[0]
        n = 0
        for line in open(f):
            o = json.loads(line)
            if o["kind"] == "http_request" and isinstance(o.get("body"), dict):
                e = {"case": case, "n": n, "transport": "http", "body": o["body"]}
            elif o["kind"] == "ws_in":
                e = {"case": case, "n": n, "transport": "socket", "frame": o["frame"]}
            else:
                continue
            n += 1
            out.write(json.dumps(e, ensure_ascii=False) + "\n")
