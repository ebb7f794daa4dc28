"""The login-node side must never import torch or deepspeed."""

import subprocess
import sys

CHECK = r"""
import sys
import pipeswift_slurm, pipeswift_slurm.cli.main, pipeswift_slurm.config, pipeswift_slurm.plan
import pipeswift_slurm.slurm.sbatch, pipeswift_slurm.slurm.client, pipeswift_slurm.history.rundir, pipeswift_slurm.local
from pipeswift_slurm.cli.main import cli
for args in (["--help"], *[[c, "--help"] for c in cli.list_commands(None)]):
    try:
        cli.main(args, prog_name="pswift", standalone_mode=False)
    except SystemExit:
        pass
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "deepspeed", "numpy"))
print("HEAVY", heavy)
sys.exit(1 if heavy else 0)
"""


def test_cli_and_library_never_import_torch_or_deepspeed():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "HEAVY []" in proc.stdout


def test_dry_run_never_imports_torch(tmp_path):
    from helpers import EXAMPLE
    code = ("import sys; from pipeswift_slurm.cli.main import cli\n"
            "try:\n cli.main(['sbatch', '--dry-run', sys.argv[1]], standalone_mode=False)\n"
            "except SystemExit: pass\n"
            "bad=[m for m in sys.modules if m.split('.')[0] in ('torch','deepspeed')]\n"
            "print('HEAVY', bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code, str(EXAMPLE / "train.toml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout


def test_planning_simulating_and_reporting_never_import_torch(tmp_path):
    from helpers import EXAMPLE
    code = ("import sys; from pipeswift_slurm.cli.main import cli\n"
            "for args in (['plan', '--no-live', sys.argv[1]], ['simulate', sys.argv[1], '--json'],\n"
            "             ['partition', '--costs', '1,2,3', '-P', '2'], ['history', 'ingest', '--db', sys.argv[2]],\n"
            "             ['history', 'report', '--db', sys.argv[2]]):\n"
            "    try:\n        cli.main(args, standalone_mode=False)\n"
            "    except (SystemExit, click.ClickException):\n        pass\n"   # an empty history's report
            "bad=[m for m in sys.modules if m.split('.')[0] in ('torch','deepspeed')]\n"
            "print('HEAVY', bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", "import click\n" + code, str(EXAMPLE / "train.toml"), str(tmp_path / "h.db")],
                          capture_output=True, text=True, env={**__import__("os").environ,
                                                               "PSWIFT_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "HEAVY []" in proc.stdout and "chosen:" in proc.stdout
