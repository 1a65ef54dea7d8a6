"""Launch configs: every way a config can be wrong fails before anything starts, with
an error naming the key, the file and the line (or the command-line override)."""
import pytest

from distgrad.launch.config import ConfigError, load_config, parse_override
from distgrad.launch.config_lines import key_lines
from distgrad.launch.resolve import plan
from distgrad.launch.command import _prepare

from launch_support import TINY

pytestmark = pytest.mark.timeout(60)

#: replaces TINY's "[world]\nworkers = 2" after a [[hooks]] entry written before it
AUTOGRAD_WORLD = '[world]\nworkers = 2\nstrategy = "autograd"'

def write(tmp_path, text=TINY, name="c.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def resolve(path, overrides=()):
    """What `distgrad launch` does before starting anything."""
    class Args:
        config, local = path, True
    Args.overrides = list(overrides)
    return _prepare(Args)


def test_a_good_config_gets_its_defaults(tmp_path):
    config = load_config(write(tmp_path), ["optim.lr=0.5", "world.transport=tcp"])
    assert config["optim"]["lr"] == 0.5 and config["world"]["transport"] == "tcp"
    assert config["run"]["name"] == "c"                    # the file's name
    assert config["pipeline"] == {"micro_batches": 1, "schedule": "gpipe",
                                  "defer_weight_grads": True}
    assert config["checkpoint"] == {"every": 0, "keep": 2}
    assert config["hooks"] == [] and config["offload"] == {}
    p = plan(config)
    assert p.balance == [2, 3] and p.layers == [(0, 2), (2, 5)]
    assert "distgrad.launch.stage" in p.worker_modules()


def test_key_lines_follow_tables_arrays_and_dotted_keys():
    lines = key_lines("[run]\nsteps = 1\n\n[[hooks]]\nref = 'a:b'\n[[hooks]]\nref = 'c:d'\n"
                      "[model]\nkwargs.sizes = [1]\n")
    assert lines["run.steps"] == 2 and lines["hooks.0.ref"] == 5 and lines["hooks.1.ref"] == 7
    assert lines["model.kwargs.sizes"] == 9


@pytest.mark.parametrize("edit, key, at, words", [
    (("[run]\n", "[runs]\n"), "runs", "[runs]", "unknown table"),
    (("steps = 6", "steps = 6\nstep = 3"), "run.step", "step = 3", "unknown key"),
    (("steps = 6", 'steps = "six"'), "run.steps", "steps =", "expected an integer, got a string"),
    (("steps = 6", "steps = true"), "run.steps", "steps =", "expected an integer, got a boolean"),
    (("steps = 6", "steps = 0"), "run.steps", "steps =", "at least 1"),
    (("steps = 6", "epochs = 2\nsteps = 6"), "run.epochs", "epochs =", "not both"),
    (("steps = 6", "seed = 1"), "run.steps", "[run]", "missing"),
    (('factory = "mlp"\n', ""), "model.factory", "[model]", "missing"),
    (('source = "spirals"\n', ""), "data.source", "[data]", "missing"),
    (("batch_size = 32\n", ""), "data.batch_size", "[data]", "missing"),
    (("workers = 2", 'workers = 2\nstrategy = "fsdp"'), "world.strategy", "strategy =",
     "one of 'pipeline', 'autograd', 'ddp', got 'fsdp'"),
    (("workers = 2", 'workers = 2\nstrategy = "ddp"\nreplicas = 3'), "world.replicas",
     "replicas =", "every worker is a replica: give 2 (world.workers) or leave it out"),
    (("workers = 2", "workers = 3\nreplicas = 2"), "world.replicas", "replicas =",
     "2 replicas cannot share world.workers 3 equally"),
    (("workers = 2", "workers = 2\nreplicas = 0"), "world.replicas", "replicas =",
     "at least 1"),
    (("workers = 2", 'workers = 3\nstrategy = "ddp"'), "data.batch_size", "batch_size =",
     "32 samples cannot be split into 3 equal shards"),
    (("[world]\nworkers = 2", '[pipeline]\nmicro_batches = 17\n[world]\nworkers = 2\n'
                                'strategy = "ddp"'), "pipeline.micro_batches", "micro_batches =",
     "17 micro-batches cannot split data.batch_size 32's shard of 16 samples per replica"),
    (("[world]\nworkers = 2", "[pipeline]\nbalance = [1, 1, 1, 2]\n[world]\nworkers = 4\n"
                                "replicas = 2"), "pipeline.balance", "balance =",
     "gives 4 stages but the world has 2 (world.workers 4 / world.replicas 2)"),
    (("workers = 2", 'workers = 2\ntransport = "udp"'), "world.transport", "transport =",
     "one of 'ipc', 'tcp'"),
    (("rpc_timeout = 30.0", "rpc_timeout = -5"), "world.rpc_timeout", "rpc_timeout =",
     "at least 0"),
    (("[optim]", "[pipeline]\nbalance = [1, 2, 2]\n[optim]"), "pipeline.balance", "balance =",
     "3 stages"),
    (("[optim]", "[pipeline]\nmicro_batches = 33\n[optim]"), "pipeline.micro_batches",
     "micro_batches =", "cannot split data.batch_size 32"),
    (("[optim]", '[pipeline]\nschedule = "zigzag"\n[optim]'), "pipeline.schedule", "schedule =",
     "one of"),
    (('factory = "mlp"', 'factory = "not a name"'), "model.factory", "factory =",
     "neither a built-in"),
    (("[run]\n", "offload = 3\n[run]\n"), "offload", "offload =", "expected a table"),
    (("[optim]", '[offload]\nkind = "disk"\nbogus = 1\n[optim]'), "offload.bogus", "bogus =",
     "unknown key 'bogus'"),
    (("[optim]", '[[hooks]]\nref = "no colon"\n[optim]'), "hooks.0.ref", "ref =",
     "module:qualname"),
    (("[optim]", "[[hooks]]\nevery = 2\n[optim]"), "hooks.0.ref", "[[hooks]]", "missing"),
    (("[optim]", "[checkpoint]\nevery = 1.5\n[optim]"), "checkpoint.every", "every = 1.5",
     "an integer"),
    # what only world.strategy = "autograd" offers, and what it does not
    (('factory = "mlp"', 'factory = "mlp"\naux_weight = 0.1'), "model.aux_weight",
     "aux_weight =", "needs world.strategy \"autograd\", not 'pipeline'"),
    (("[optim]", '[[hooks]]\nref = "a:b"\nkind = "forward"\n[optim]'), "hooks.0.kind",
     "kind =", "run in the coordinator and need world.strategy \"autograd\""),
    (("[world]\nworkers = 2", '[[hooks]]\nref = "a:b"\n' + AUTOGRAD_WORLD),
     "hooks.0.kind", "[[hooks]]", "\"step\" hooks (run on each stage before its optimizer "
                                "step) are not available"),
    (("[world]\nworkers = 2", '[[hooks]]\nref = "a:b"\nkind = "tensor_grad"\n' + AUTOGRAD_WORLD),
     "hooks.0.parameter", "[[hooks]]", "missing"),
    (("[world]\nworkers = 2", '[[hooks]]\nref = "a:b"\nkind = "forward"\nstages = [0, 2]\n'
                               + AUTOGRAD_WORLD),
     "hooks.0.stages", "stages =", "stage 2 does not exist: the pipeline has 2 stages"),
    (("[world]\nworkers = 2", '[[hooks]]\nref = "a:b"\nkind = "forward"\nparameter = "0.weight"\n'
                               + AUTOGRAD_WORLD),
     "hooks.0.parameter", "parameter =", "only \"tensor_grad\" hooks watch a parameter"),
    (("workers = 2", 'workers = 2\nstrategy = "autograd"\nreplicas = 2'), "world.replicas",
     "replicas =", "trains one pipeline"),
    (("workers = 2", 'workers = 2\nstrategy = "autograd"\n[offload]\nkind = "disk"'),
     "offload", "[offload]", "not available with world.strategy \"autograd\""),
    (("workers = 2", 'workers = 2\nsimulated_link = "fast"'), "world.simulated_link",
     "simulated_link =", "a simulated link is '<latency> <bandwidth>'"),
])
def test_config_errors_name_key_file_and_line(tmp_path, edit, key, at, words):
    text = TINY.replace(*edit)
    path = write(tmp_path, text)
    line = next(n for n, content in enumerate(text.splitlines(), 1) if at in content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    e = info.value
    assert (e.key, e.source, e.line) == (key, path, line), str(e)
    assert words in str(e) and f"{path}:{line}: {key}:" in str(e)


@pytest.mark.parametrize("edit, key, words", [
    (('factory = "mlp"', 'factory = "nosuchmodule:f"'), "model.factory",
     "cannot import 'nosuchmodule'"),
    (('factory = "mlp"', 'factory = "distgrad.launch.models:nope"'), "model.factory",
     "has no 'nope'"),
    (('factory = "mlp"', 'factory = "cnn"'), "model.factory", "not a built-in name (known: mlp)"),
    (("sizes = [2, 8, 8, 2] }", "sizes = [2, 8, 8, 2], depth = 3 }"), "model.kwargs.depth",
     "unexpected keyword argument 'depth'"),
    (("sizes = [2, 8, 8, 2] }", "sizes = [2, -1] }"), "model.factory", "building the model failed"),
    (('factory = "mlp"\nkwargs = { sizes = [2, 8, 8, 2] }',
      'factory = "distgrad.launch.data:spirals"'), "model.factory", "must return an nn.Sequential"),
    (("kwargs = { n = 256 }", "kwargs = { m = 256 }"), "data.kwargs.m", "unexpected keyword"),
    (("[optim]", '[optim]\nname = "Adamm"'), "optim.name", "not a built-in name"),
    (("lr = 0.05", "lr = 0.05\nmomentun = 0.9"), "optim.momentun", "unexpected keyword"),
    (("lr = 0.05", "lr = -1.0"), "optim.lr", "Adam (lr = -1.0): Invalid learning rate"),
    (("workers = 2", "workers = 9"), "world.workers", "9 stages need at least 9 layers"),
    (("[optim]", "[pipeline]\nbalance = [1, 1]\n[optim]"), "pipeline.balance",
     "covers 2 layers but the model has 5"),
    (("[optim]", '[[hooks]]\nref = "distgrad.launch.hooks:clip_grad_norm"\nmax_nrm = 1\n[optim]'),
     "hooks.0.max_nrm", "unexpected keyword argument 'max_nrm'"),
    (("[optim]", '[[hooks]]\nref = "distgrad.launch.hooks:clip_grad_norm"\n[optim]'),
     "hooks.0", "missing a required argument: 'max_norm'"),
    (("[world]\nworkers = 2", '[[hooks]]\nref = "distgrad.launch.hooks:tensor_grad_norm"\n'
                               'kind = "tensor_grad"\nparameter = "0.weigth"\n' + AUTOGRAD_WORLD),
     "hooks.0.parameter", "no parameter '0.weigth' (did you mean '0.weight'?)"),
    (("[world]\nworkers = 2", '[[hooks]]\nref = "distgrad.launch.hooks:activation_stats"\n'
                               'kind = "forward"\nscale = 2\n' + AUTOGRAD_WORLD),
     "hooks.0.scale", "unexpected keyword argument 'scale'"),
])
def test_references_and_arguments_are_checked_before_starting(tmp_path, edit, key, words):
    path = write(tmp_path, TINY.replace(*edit))
    with pytest.raises(ConfigError) as info:
        resolve(path)
    assert info.value.key == key and words in str(info.value), str(info.value)
    assert info.value.source == path and info.value.line is not None


def test_replicas_default_to_one_pipeline_or_every_ddp_worker(tmp_path):
    path = write(tmp_path)
    assert load_config(path)["world"]["replicas"] == 1
    ddp = load_config(path, ["world.strategy=ddp", "world.workers=4"])
    assert ddp["world"]["replicas"] == 4 and plan(ddp).layers == [(0, 5)]
    both = load_config(path, ["world.workers=4", "world.replicas=2"])
    assert plan(both).balance == [2, 3]
    with pytest.raises(ConfigError, match=r"command line override 'world.replicas=3': "
                                          r"world.replicas: 3 replicas cannot share"):
        load_config(path, ["world.workers=4", "world.replicas=3"])


def test_overrides_are_toml_or_strings_and_errors_name_them(tmp_path):
    assert parse_override("optim.lr=1e-3") == (["optim", "lr"], 1e-3)
    assert parse_override("pipeline.balance=[2, 3]") == (["pipeline", "balance"], [2, 3])
    assert parse_override("data.source=spirals") == (["data", "source"], "spirals")
    path = write(tmp_path)
    with pytest.raises(ConfigError, match=r"command line override 'run.steps=lots': run.steps: "
                                          r"expected an integer"):
        load_config(path, ["run.steps=lots"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(path, ["run.steps"])
    with pytest.raises(ConfigError, match="run.steps is not a table"):
        load_config(path, ["run.steps.x=1"])
    with pytest.raises(ConfigError, match=r"entries of \[\[hooks\]\]"):
        load_config(write(tmp_path, TINY + '[[hooks]]\nref = "a:b"\n', "h.toml"),
                    ["hooks.0.ref=c:d"])
    with pytest.raises(ConfigError, match="override 'optim.lrr=1'.*unexpected keyword"):
        resolve(path, ["optim.lrr=1"])


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match=r"missing.toml: cannot read the config"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"c.toml: not valid TOML: .*line 2"):
        load_config(write(tmp_path, "[run]\nsteps = = 3\n"))


def test_scheduler_world_size_must_match_the_config(tmp_path, monkeypatch):
    from distgrad.launch.environment import detect
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_ID": "0"}
    with pytest.raises(ValueError, match="SLURM_NTASKS=4 but the config's world.workers "
                                         "needs 3 processes"):
        detect(2, env)


def test_a_launch_in_a_slurm_batch_script_outside_srun_says_so_instead_of_waiting():
    """The batch script of ``sbatch --ntasks=3`` has SLURM_PROCID=0 and SLURM_NTASKS=3 but
    no step: as rank 0 it would wait for two tasks nobody starts."""
    from distgrad.launch.environment import detect
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "7",
             "SLURM_JOB_NODELIST": "localhost"}
    with pytest.raises(ValueError, match=r"batch script of Slurm job 7, not a task of an srun "
                                         r"step: .*`srun --overcommit distgrad launch"):
        detect(2, batch)
    assert detect(2, batch, force_local=True).kind == "local"
    assert detect(2, dict(batch, SLURM_STEP_ID="0")).kind == "slurm"


def test_a_misspelled_name_in_an_override_is_blamed_on_the_override_with_the_right_name(
        tmp_path):
    path = write(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(path, ["optimizer.lr=0.1"])
    assert (info.value.key, info.value.source, info.value.line) == (
        "optimizer", "command line override 'optimizer.lr=0.1'", None)
    assert "optimizer: unknown table or key (did you mean 'optim'?); known: run, world" \
        in str(info.value)
    with pytest.raises(ConfigError, match=r"^command line override 'run.stepz=3': run.stepz: "
                                          r"unknown key \(did you mean 'steps'\?\)"):
        load_config(path, ["run.stepz=3"])
    # the same mistake in the file is the file's, at its line
    in_file = write(tmp_path, TINY + "[optimizer]\nlr = 0.1\n", "o.toml")
    with pytest.raises(ConfigError, match=rf"^{in_file}:22: optimizer: unknown table or key "
                                          r"\(did you mean 'optim'\?\)"):
        load_config(in_file)
    with pytest.raises(ConfigError, match="unknown table or key; known"):  # nothing close
        load_config(path, ["zzz.lr=0.1"])


def _command(*args, cwd):
    import subprocess
    import sys
    from launch_support import ROOT
    return subprocess.run([sys.executable, "-W", "error", "-m", "distgrad", "launch", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "PYTHONPATH": ROOT})


def test_help_config_lists_every_key_of_every_table_offload_too(tmp_path):
    from distgrad.launch.config import SCHEMA
    from distgrad.offload.config import KEYS, KEY_DOCS, POLICY_DOCS
    from distgrad.offload.policy import OffloadPolicy
    assert set(KEY_DOCS) == {"kind", *(k for keys in KEYS.values() for k in keys)}
    assert tuple(POLICY_DOCS) == OffloadPolicy.KEYS          # every key the checks accept
    done = _command("--help-config", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = {}
    table = None
    for line in done.stdout.splitlines():
        if line.startswith("["):
            table = line.split()[0].strip("[]")
            listed[table] = set()
        else:
            listed[table].add(line.split()[0])
    for name, fields in SCHEMA.items():
        assert set(fields) <= listed[name], name
    assert listed["offload"] == set(KEY_DOCS)
    assert listed["offload.policy"] == set(OffloadPolicy.KEYS)


def test_a_launch_without_overrides_warns_of_nothing(tmp_path):
    path = write(tmp_path)
    done = _command("--check", path, cwd=tmp_path)   # options first: no override follows
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    done = _command(path, "optim.lr=0.5", "--check", "run.steps=3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"lr": 0.5' in done.stdout and '"steps": 3' in done.stdout
