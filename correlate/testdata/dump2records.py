#!/usr/bin/env python3
"""Convert a capture dump into a replay records file.

usage: dump2records.py [--job JOB] DUMP.jsonl TRUTH.jsonl... "TITLE" | gzip -9 > NAME.records.gz

DUMP is what SLOWRANK_IT_DUMP=FILE wrote (every capture record in pipeline
order); TRUTH is FILE.truth, the fake trainer's iterations, or a loop's own
steps.jsonl (bench/gpu/ext_loops.sh: {"step", "start_ns", "end_ns"} lines
of one rank, 0), or several: bench/gpu/train.py's rank<R>.jsonl, one file per
rank, whose lines name their "rank" (lines without "start_ns", such as its
injection and final records, are skipped). With --job, only the processes of that job (RankInfo.Job)
that made host calls are kept: a dump of several jobs in sequence, or one
whose compile workers registered as ranks too. The output is the format
that correlate's replayTrainerFile reads (extloops_test.go): ranks (with
the world size when it is not 2), communicator creations, host calls (a
call without an op, such as a torch c10d Work::wait, has op "-") and
iterations, with pids, communicators and streams renamed to small numbers
and times in ns from the earliest host call, so that a failure under load
becomes a deterministic test. Thread ids are not kept (the replay gives
every call its process's): correlate reads them only in burstDet, which
counts the waits of the collectives' thread, so a capture whose collectives
and their waits are all on one thread (torch c10d's main thread; gloo's
worker threads make synchronisations only) replays as the agent saw it.
"""
import json
import sys


def main(dump, truths, title, job=None):
    recs = [json.loads(l) for l in open(dump)]
    infos = [r["record"] for r in recs if r["type"] == "correlate.RankInfo"]
    callers = {r["record"]["PID"] for r in recs if r["type"] == "correlate.HostCall"}
    keep = {i["PID"] for i in infos if job is None or (i["Job"] == job and i["PID"] in callers)}
    recs = [r for r in recs if r["record"].get("PID") in keep]
    calls = [r["record"] for r in recs if r["type"] == "correlate.HostCall"]
    base = min(c["StartNS"] for c in calls)  # a nested call starts before the first to end
    rank_of = {i["PID"]: i["Rank"] for i in infos if i["PID"] in keep}
    world = {i["PID"]: i["WorldSize"] for i in infos if i["PID"] in keep}
    ids = {}

    def small(pid, v):
        """v renamed 1, 2, ... in the order the process pid used it."""
        if v == 0:
            return 0
        return ids.setdefault((pid, v), 1 + sum(1 for k in ids if k[0] == pid))

    print(f"# {title}, agent's capture records in pipeline order ({len(rank_of)} ranks):")
    print("# r RANK [WORLDSIZE, if not 2] | c RANK NRANKS | h RANK KIND OP(- for none) COUNT DATATYPE COMM STREAM START DUR"
          " | i RANK START END (the trainer's iterations); ns from the earliest host call")
    for r in recs:
        v = r["record"]
        if r["type"] == "correlate.RankInfo":
            print(f"r {v['Rank']}" + ("" if v["WorldSize"] == 2 else f" {v['WorldSize']}"))
        elif r["type"] == "correlate.CommInit":
            print(f"c {rank_of[v['PID']]} {v['NRanks']}")
        elif r["type"] == "correlate.HostCall":
            op = {"cudaStreamSynchronize": "s", "": "-"}.get(v["Op"], v["Op"])
            comm = 1 if v["Comm"] else 0  # the replay creates one communicator, 1
            print(f"h {rank_of[v['PID']]} {v['Kind']} {op} {v['Count']} {v['Datatype']} {comm}"
                  f" {small(v['PID'], v['Stream'])} {v['StartNS'] - base} {v['EndNS'] - v['StartNS']}")
    for truth in truths:
        for l in open(truth):
            x = json.loads(l)
            if x.get("kind") == "step" or ("kind" not in x and "start_ns" in x):
                print(f"i {x.get('rank', 0)} {x['start_ns'] - base} {x['end_ns'] - base}")


if __name__ == "__main__":
    args = sys.argv[1:]
    job = None
    if args[:1] == ["--job"] and len(args) > 1:
        job, args = args[1], args[2:]
    if len(args) < 3:
        sys.exit(__doc__)
    main(args[0], args[1:-1], args[-1], job=job)
