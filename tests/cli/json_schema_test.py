"""Every command's --json document, as the command prints it today, against its JSON Schema
in docs/schema/ (docs/json-schema.md).

    json_schema_test.py SHARDMM SOURCE_DIR

runs each command below on a small mesh and validates what it prints (and the profile file
calibrate writes, and the repository's profiles/*.json) with Debian's python3-jsonschema.
An integer there is a JSON integer: 4.0 is not one, though JSON Schema alone would take it.
Fails when a document breaks its schema, a command fails, a schema file goes unused, or the
plans printed leave an op kind or a bound unexercised (the step schema's rules per op).
"""
import json
import pathlib
import subprocess
import sys
import tempfile

import jsonschema

SPEED = ["--repeat", "1", "--warmup", "0", "--warmup-time", "0"]


def commands(tmp, source):
    """(schema, arguments) for every document checked; calibrate comes before the commands that read its profile."""
    profile = str(tmp / "calibrated.json")
    # FSDP's regathered weights, which --rings gathers round a ring under each einsum.
    fsdp_program = str(tmp / "fsdp.prog")
    pathlib.Path(fsdp_program).write_text(
        "mesh X=4\ndims B=8, T=256, D=1024, F=2048\ninput x[B, T, D] : x[B_X, T, D]\n"
        "param w_in[D, F] regathered : w_in[D_X, F]\nparam w_out[F, D] regathered : w_out[F_X, D]\n"
        "input g[B, T, D] : g[B_X, T, D]\nu[B, T, F] = x @ w_in\ny[B, T, D] = gelu(u) @ w_out\nloss sum(y * g)\n")
    return [
        ("plan.json", ["plan", "A[I, J_X] @ B[J_X, K] -> C[I, K_X]", "--mesh", "X=2", "--dims", "I=8192,J=4096,K=16384"]),
        ("plan.json", ["plan", "A[I, J_X] @ B[J_X, K]", "--mesh", "X=2,Y=2", "--dims", "I=64,J=32,K=16",
                       "--mem-limit", "6KiB"]),
        ("plan.json", ["plan", "A[I_X, J] @ B[J, K_Y]", "--mesh", "X=2,Y=2", "--dims", "I=64,J=32,K=16"]),
        ("reshard.json", ["reshard", "A[I, J_X]", "A[I_X, J]", "--mesh", "X=2", "--dims", "I=64,J=32"]),
        ("reshard.json", ["reshard", "C[I, K]", "C[I, K]{U_X}", "--mesh", "X=2", "--dims", "I=64,K=16"]),
        ("reshard.json", ["reshard", "C[I_X, K]", "C[I, K]{U_X}", "--mesh", "X=2", "--dims", "I=64,K=16"]),
        ("reshard.json", ["reshard", "C[I_X, K]", "C[I, K]", "--mesh", "X=1,Y=2", "--dims", "I=64,K=16"]),
        ("reshard-run.json", ["reshard", "A[I, J_X]", "A[I_X, J]", "--mesh", "X=2", "--dims", "I=64,J=32",
                              "--dtype", "f32", "--run", "--trace", str(tmp / "trace.json"), *SPEED]),
        ("check.json", ["check", "A[I_XY, J]", "--mesh", "X=3,Y=2", "--dims", "I=10,J=4", "--dtype", "f32"]),
        ("check.json", ["check", "A[I_XY, J]{U_Z}", "--mesh", "X=3,Y=2,Z=2"]),
        ("check.json", ["check", "A[I, J] = P(('Y', 'X'), None)", "--mesh", "X=3,Y=2"]),
        ("check.json", ["check", "A[I_XYZ]", "--mesh", "X=16,Y=16,Z=17", "--dims", "I=4352"]),
        ("check.json", ["check", "A[I_X, J]", "--mesh", "X=4", "--split", "chunk", "--dims", "I=10,J=4"]),
        ("calibrate.json", ["calibrate", "--quick", "--mesh", "X=2", "--out", profile]),
        ("run.json", ["run", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=2", "--dims", "I=64,J=32,K=16",
                      "--backend", "threads", *SPEED]),
        ("run.json", ["run", "A[I_X, J] @ B[J, K_Y]", "--mesh", "X=3,Y=2", "--split", "chunk", "--dims",
                      "I=10,J=8,K=7", *SPEED]),
        ("run.json", ["run", "A[I_X, J] @ B[J, K_X]", "--mesh", "X=2", "--dims", "I=32,J=16,K=8", "--dtype", "f64",
                      "--candidate", "2", "--hw", profile, *SPEED]),
        ("model.json", ["model", "mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=4,D=8,F=16"]),
        ("model.json", ["model", "block", "--strategy", "dp+tp", "--mesh", "dp=2,tp=2", "--dims", "B=2,T=4,D=8,F=16,H=2",
                        "--infer"]),
        ("model.json", ["model", "mlp", "--strategy", "fsdp", "--mesh", "X=2", "--dims", "B=2,T=4,D=8,F=16", "--run"]),
        ("program.json", ["program", str(source / "examples/programs/mlp.prog")]),
        ("program.json", ["program", str(source / "examples/programs/gpt.prog"), "--infer", "--optimizer", "adam"]),
        ("program.json", ["program", str(source / "examples/programs/mlp.prog"), "--mesh", "X=2",
                          "--dims", "B=2,T=2,D=4,F=6", "--run"]),
        ("program.json", ["program", fsdp_program, "--hw", "tpu-v5e", "--rings"]),
        ("solve.json", ["solve", str(source / "examples/programs/mlp_free.prog"), "--explain", "--top", "2",
                        "--dims", "B=8,T=64,D=256,F=1024", "--mem-limit", "4MiB"]),
        ("solve.json", ["solve", str(source / "examples/programs/mlp_free.prog"), "--mesh", "X=2",
                        "--dims", "B=2,T=2,D=4,F=6", "--run", "--infer"]),
        # three axes: a neighbourhood search, --top and --explain within its last neighbourhood
        ("solve.json", ["solve", str(source / "examples/programs/mlp_free.prog"), "--mesh", "a=2,b=2,c=2",
                        "--dims", "B=8,T=64,D=256,F=1024", "--explain", "--top", "2"]),
        ("bench-collectives.json", ["bench", "collectives", "--mesh", "X=2", "--sizes", "1KiB", "--trials", "1"]),
        ("bench-matmul.json", ["bench", "matmul", "A[I_X, J] @ B[J, K_X]", "--mesh", "X=2", "--sizes", "32",
                               "--repeat", "1", "--warmup", "0"]),
        ("bench-matmul.json", ["bench", "matmul", "A[I_X, J] @ B[J, K_X]", "--mesh", "X=2", "--sizes", "32",
                               "--repeat", "1", "--warmup", "0", "--all", "--hw", profile]),
    ]


def strict_validator(schema_dir):
    """A 2020-12 validator for schema_dir's files, which $ref one another by file name."""
    store = {p.resolve().as_uri(): json.loads(p.read_text()) for p in schema_dir.glob("*.json")}
    base = jsonschema.Draft202012Validator
    for schema in store.values():
        base.check_schema(schema)
    types = base.TYPE_CHECKER.redefine("integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    cls = jsonschema.validators.extend(base, type_checker=types)

    def errors(ref, doc):
        """ref: a schema file's name, with a fragment where a definition inside it is meant."""
        name, _, fragment = ref.partition("#")
        uri = (schema_dir / name).resolve().as_uri()
        resolver = jsonschema.RefResolver(uri, store[uri], store=store)
        schema = resolver.resolve_fragment(store[uri], fragment)

        def leaves(e):  # a oneOf's or anyOf's error: every branch's
            return [x for c in e.context for x in leaves(c)] if e.context else [e]

        found = [f"{'/'.join(map(str, x.absolute_path)) or '(top)'}: {x.message[:200]}"
                 for e in cls(schema, resolver=resolver).iter_errors(doc) for x in leaves(e)]
        return list(dict.fromkeys(found))

    return errors


def main(shardmm, source_dir):
    schema_dir = source_dir / "docs" / "schema"
    errors = strict_validator(schema_dir)
    failures, used, steps = [], set(), []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for schema, args in commands(tmp, source_dir):
            line = "shardmm " + " ".join(args) + " --json"
            # calibrate refuses timings too noisy to fit, as other tests running beside it can make them.
            for _ in range(3 if args[0] == "calibrate" else 1):
                done = subprocess.run([shardmm, *args, "--json"], capture_output=True, text=True, timeout=120)
                if done.returncode == 0:
                    break
            if done.returncode != 0:
                failures.append(f"{line}: exit {done.returncode}\n{done.stderr}")
                continue
            if not done.stdout.endswith("}\n"):
                failures.append(f"{line}: the document does not end in '}}' and one newline")
            doc = json.loads(done.stdout)
            used.add(schema)
            failures += [f"{line} ({schema}): {e}" for e in errors(schema, doc)]
            steps += [s for c in doc.get("candidates", []) for s in c["steps"]]
        calibrated = tmp / "calibrated.json"
        files = [(calibrated, "profile.json#/$defs/calibrated")] if calibrated.exists() else []
        files += [(p, "profile.json") for p in sorted((source_dir / "profiles").glob("*.json"))]
        for path, schema in files:
            used.add(schema.split("#")[0])
            failures += [f"{path.name} ({schema}): {e}" for e in errors(schema, json.loads(path.read_text()))]
    unused = {p.name for p in schema_dir.glob("*.json")} - used - {"common.json"}
    failures += [f"docs/schema/{name}: no document here is validated against it" for name in sorted(unused)]
    common = json.loads((schema_dir / "common.json").read_text())["$defs"]
    for key, values in (("op", common["op"]["enum"]), ("bound", common["step_keys"]["properties"]["bound"]["enum"])):
        missing = set(values) - {s[key] for s in steps}
        failures += [f"no step printed has {key} {v!r}: add a command that prints one" for v in sorted(missing, key=str)]
    for f in failures:
        print(f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], pathlib.Path(sys.argv[2])))
