"""docs/deploy.md's compose set-up copies the stack's settings and secrets (the worker
token, PostgreSQL's password, the session key) to `.env`: git must never see that file."""

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repo, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def test_the_documented_env_file_stays_out_of_git(tmp_path: Path) -> None:
    docs = (ROOT / "docs" / "deploy.md").read_text()
    blocks = [b.split("```", 1)[0] for b in docs.split("```sh\n")[1:]]
    setup = next(b for b in blocks if "env.example" in b)
    copy = next(line.split("#")[0].strip() for line in setup.splitlines() if "env.example" in line)
    assert copy == "cp deploy/env.example .env"
    # A checkout with the repository's ignore rules, then the set-up's first step.
    repo = tmp_path / "checkout"
    (repo / "deploy").mkdir(parents=True)
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    shutil.copy(ROOT / "deploy" / "env.example", repo / "deploy" / "env.example")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "checkout")
    subprocess.run(copy, shell=True, cwd=repo, check=True)
    assert "VRAMLAB_WORKER_TOKEN" in (repo / ".env").read_text()
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    git(repo, "add", "-A")  # what commits everything there is
    assert git(repo, "diff", "--cached", "--name-only") == ""
