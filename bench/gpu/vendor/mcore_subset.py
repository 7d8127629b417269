#!/usr/bin/env python3
"""Builds bench/gpu/vendor/megatron-core-<commit>.tar.xz: the part of
Megatron-LM's pure-Python megatron/core that bench/gpu/ext_loops.py's
Megatron loop can import, plus Megatron-LM's LICENSE and a MANIFEST.

    python3 bench/gpu/vendor/mcore_subset.py MEGATRON_LM_CHECKOUT COMMIT [OUT.tar.xz]

The subset is the static import closure (every `import megatron...` and
`from megatron... import` in a reached file, module level and inside
functions alike, so lazily imported modules come too) of the modules the
loop imports (START below), with every parent package's __init__.py.
Dynamic imports (importlib) are not followed; none of those in the subset
is on the local-spec GPT path. The archive is reproducible (sorted names,
mtime 0, uid/gid 0). Needs only the standard library."""
import ast
import io
import lzma
import os
import sys
import tarfile

START = [
    "megatron.core",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.tensor_parallel.random",
    "megatron.core.transformer.transformer_config",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.distributed",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.timers",
    "megatron.core.optimizer",
    "megatron.core.optimizer.optimizer_config",
]


def locate(root, mod):
    """(file, is_package); file None when absent, "" for a namespace package."""
    p = os.path.join(root, *mod.split("."))
    if os.path.isfile(os.path.join(p, "__init__.py")):
        return os.path.join(p, "__init__.py"), True
    if os.path.isfile(p + ".py"):
        return p + ".py", False
    if os.path.isdir(p):
        return "", True
    return None, False


def closure(root, start):
    seen, todo = {}, list(start)

    def want(mod):
        parts = mod.split(".")
        for i in range(1, len(parts) + 1):
            m = ".".join(parts[:i])
            if m.startswith("megatron") and m not in seen:
                todo.append(m)

    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        f, pkg = locate(root, mod)
        seen[mod] = f
        if not f:
            continue
        want(mod)
        base = mod if pkg else mod.rsplit(".", 1)[0]
        for n in ast.walk(ast.parse(open(f, encoding="utf-8").read(), f)):
            if isinstance(n, ast.Import):
                for a in n.names:
                    if a.name.startswith("megatron"):
                        want(a.name)
            elif isinstance(n, ast.ImportFrom):
                if n.level:
                    b = base.split(".")
                    b = b[:len(b) - (n.level - 1)]
                    m = ".".join(b + ([n.module] if n.module else []))
                else:
                    m = n.module or ""
                if not m.startswith("megatron"):
                    continue
                want(m)
                for a in n.names:
                    if locate(root, m + "." + a.name)[0] is not None:
                        want(m + "." + a.name)
    return sorted({os.path.relpath(f, root) for f in seen.values() if f})


def main():
    root, commit = sys.argv[1], sys.argv[2]
    out = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(__file__),
                                                                f"megatron-core-{commit[:7]}.tar.xz")
    files = closure(root, START)
    manifest = (f"Megatron-LM {commit}: megatron/core subset for bench/gpu/ext_loops.py\n"
                f"made by bench/gpu/vendor/mcore_subset.py, {len(files)} files\n" + "\n".join(files) + "\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name, data):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = len(data), 0, 0o644, 0, 0, "", ""
            tar.addfile(ti, io.BytesIO(data))
        add("LICENSE", open(os.path.join(root, "LICENSE"), "rb").read())
        add("MANIFEST", manifest.encode())
        for f in files:
            add(f, open(os.path.join(root, f), "rb").read())
    with open(out, "wb") as g:
        g.write(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    print(f"{out}: {len(files)} files, {sum(os.path.getsize(os.path.join(root, f)) for f in files)} bytes of source, "
          f"{os.path.getsize(out)} bytes compressed")


if __name__ == "__main__":
    main()
