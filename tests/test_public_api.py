"""Pin ddpkit's public surface: adding or removing a name is a deliberate change to this list."""

import ddpkit

EXPECTED = {
    "Digits",
    "TorchBuild",
    "gpu_count",
    "torch_build",
    "Score",
    "digits_mlp",
    "exact_accuracy",
    "load_digits",
    "max_abs_diff",
    "measure_throughput",
    "relative_gaps",
    "CpuUse",
    "cpu_use",
    "plot_digits",
    "plot_runs",
    "BandwidthRow",
    "bandwidth_table",
    "bus_factor",
    "check_recorded_version",
    "collective_bandwidth",
    "copy_bandwidth",
    "plot_arrivals",
    "plot_bandwidth",
    "plot_bars",
    "plot_rendezvous",
    "plot_ranks",
    "plot_cluster",
    "plot_cluster_groups",
    "plot_mesh_groups",
    "plan_table",
    "group_link",
    "quiet_mesh",
    "Traffic",
    "plot_holdings",
    "plot_memory",
    "memory_table",
    "plot_partition",
    "number_attempts",
    "plot_restarts",
    "plot_ring_steps",
    "rank_table",
    "DistEnv",
    "PidTagged",
    "size_meaning",
    "Span",
    "Timeline",
    "idle_fraction",
    "plot_timeline",
    "replay_pipeline",
    "check_timing",
    "machine_busy",
    "Experiment",
    "exercises",
    "experiment",
    "progress",
    "Collective",
    "Mismatch",
    "first_mismatch",
    "flight_record",
    "LaunchTimeoutError",
    "RankFailedError",
    "RankFailure",
    "dist_env",
    "launch",
    "patched_environ",
    "register_magics",
    "setup_distributed",
    "start_method",
    "torchrun",
    "torchrun_environ",
}


def test_all_is_the_expected_sorted_surface():
    assert set(ddpkit.__all__) == EXPECTED
    assert list(ddpkit.__all__) == sorted(ddpkit.__all__)


def test_every_public_name_exists_and_is_documented_with_an_example():
    for name in ddpkit.__all__:
        obj = getattr(ddpkit, name)
        doc = obj.__doc__ or ""
        assert doc.strip(), f"ddpkit.{name} has no docstring"
        if callable(obj) and not isinstance(obj, type) or name in ("DistEnv",):
            assert ">>>" in doc, f"ddpkit.{name}'s docstring has no runnable example"


def test_private_modules_stay_private():
    public_modules = [n for n in dir(ddpkit) if not n.startswith("_") and type(getattr(ddpkit, n)).__name__ == "module"]
    assert public_modules == ["exercises"], public_modules  # the one public subpackage (issue 21)


def test_import_ddpkit_stays_light():
    """``import ddpkit`` must not import torch: workers, the doctor and forked ranks import it first."""
    import subprocess
    import sys

    code = "import sys, ddpkit; print(sorted(m for m in ('torch', 'ddpkit.exercises', 'ddpkit._cluster') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    assert ddpkit.exercises.check and ddpkit.Traffic and "exercises" in dir(ddpkit)
