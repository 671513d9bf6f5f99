"""The docs say what the code does: every setting in the README, every error type in
docs/results.md, every preset's article a section a reader can follow."""

from pathlib import Path

from app.catalog.presets.articles import PRESETS
from app.core.config import Settings
from app.core.contract import Environment
from vramlab.contract import ErrorType

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in Settings.model_fields:
        assert f"`VRAMLAB_{name.upper()}`" in readme, name


def test_the_first_command_a_newcomer_copies_fits_a_machine_without_a_gpu() -> None:
    """PyTorch's default download is its large CUDA build: the first block installs the
    CPU build, and the GPU line is its own block after it, each starting the service."""
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```sh\n")[1:]]
    cpu, gpu = blocks[0], blocks[1]
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu
    assert "whl/cpu" not in gpu and "torch==2.13.0" in gpu
    assert cpu.endswith("vramlab up") and gpu.endswith("vramlab up")
    assert readme.index("No GPU") < readme.index(cpu) < readme.index("With an NVIDIA GPU")


def test_results_md_explains_every_error_type() -> None:
    results = (ROOT / "docs" / "results.md").read_text()
    for error_type in ErrorType:
        assert f"| `{error_type}` |" in results, error_type


def test_results_md_names_every_environment_field() -> None:
    results = (ROOT / "docs" / "results.md").read_text()
    section = results.split("- `environment`:")[1].split("\n- ")[0]
    for name in Environment.model_fields:
        assert f"`{name}`" in section, name


def test_each_preset_points_at_a_section_a_reader_can_follow() -> None:
    findings = (ROOT / "docs" / "findings.md").read_text()
    articles = findings.split("## The presets")[0]
    for preset in PRESETS.values():
        path, _, anchor = preset.describe()["article"].partition("#")
        assert (ROOT / path).is_file()
        assert f'<a id="{anchor}"></a>' in articles, anchor
        assert f"`{preset.name}`" in articles, preset.name
