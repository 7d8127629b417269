#!/usr/bin/env python3
"""Convert an integration test's capture dump into a replay records file.

usage: dump2records.py DUMP.jsonl TRUTH.jsonl "TITLE" | gzip -9 > NAME.records.gz

DUMP is what SLOWRANK_IT_DUMP=FILE wrote (every capture record in pipeline
order); TRUTH is FILE.truth, the fake trainer's iterations. The output is
the format that correlate's replayTrainerFile reads (extloops_test.go):
ranks, communicator creations, host calls and iterations, with pids,
communicators and streams renamed to small numbers and times in ns from the
first host call, so that a failure under load becomes a deterministic test.
"""
import json
import sys


def main(dump, truth, title):
    recs = [json.loads(l) for l in open(dump)]
    calls = [r["record"] for r in recs if r["type"] == "correlate.HostCall"]
    base = calls[0]["StartNS"]
    rank_of = {r["record"]["PID"]: r["record"]["Rank"] for r in recs if r["type"] == "correlate.RankInfo"}
    ids = {}

    def small(pid, v):
        """v renamed 1, 2, ... in the order the process pid used it."""
        if v == 0:
            return 0
        return ids.setdefault((pid, v), 1 + sum(1 for k in ids if k[0] == pid))

    print(f"# {title}, agent's capture records in pipeline order ({len(rank_of)} ranks):")
    print("# r RANK | c RANK NRANKS | h RANK KIND OP COUNT DATATYPE COMM STREAM START DUR"
          " | i RANK START END (the trainer's iterations); ns from the first record")
    for r in recs:
        v = r["record"]
        if r["type"] == "correlate.RankInfo":
            print(f"r {v['Rank']}")
        elif r["type"] == "correlate.CommInit":
            print(f"c {rank_of[v['PID']]} {v['NRanks']}")
        elif r["type"] == "correlate.HostCall":
            op = "s" if v["Op"] == "cudaStreamSynchronize" else v["Op"]
            comm = 1 if v["Comm"] else 0  # the replay creates one communicator, 1
            print(f"h {rank_of[v['PID']]} {v['Kind']} {op} {v['Count']} {v['Datatype']} {comm}"
                  f" {small(v['PID'], v['Stream'])} {v['StartNS'] - base} {v['EndNS'] - v['StartNS']}")
    for l in open(truth):
        x = json.loads(l)
        if x.get("kind") == "step":
            print(f"i {x['rank']} {x['start_ns'] - base} {x['end_ns'] - base}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
