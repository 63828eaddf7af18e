"""Provider configuration: a bad table fails `gpulayer up` (and the control plane) with
one line naming the table and the key."""

from pathlib import Path

import pytest

from gpulayer import cli
from gpulayer.contracts import ProviderConfigError, parse_providers


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"gpu": {"kind": "slurm", "max_instances": "many"}},
         "[providers.gpu] max_instances: Input should be a valid integer"),
        ({"gpu": {"kind": "slurm", "partiton": "gpu"}},
         "[providers.gpu] partiton: Extra inputs are not permitted"),
        ({"gpu": {"partition": "gpu"}}, "[providers.gpu] kind: missing"),
        ({"gpu": {"kind": "k8s"}}, "[providers.gpu] kind: Input tag 'k8s'"),
        ({"sim": {"kind": "simulated", "offers": [{"name": "a", "gpus": "lots"}]}},
         "[providers.sim] offers.0.gpus: String should match pattern"),
        ({"gpu": {"kind": "slurm", "min_instances": 3, "max_instances": 1}},
         "[providers.gpu] min_instances: 3 is above max_instances (1)"),
        ({"gpu": {"kind": "slurm", "idle_timeout": "0s"}},
         "[providers.gpu] idle_timeout: Value error, a duration must be positive"),
        ({"GPU": {"kind": "local"}}, "[providers.GPU]: a provider name is lowercase"),
    ],
)  # fmt: skip
def test_a_bad_provider_table_names_the_table_and_the_key(table, message):
    with pytest.raises(ProviderConfigError) as e:
        parse_providers(table)
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_a_good_file_parses_with_durations_and_defaults():
    got = parse_providers({"providers": {
        "gpu": {"kind": "slurm", "partition": "gpu", "idle_timeout": "2m", "gres": "gpu"},
        "here": {"kind": "local"},
    }})  # fmt: skip
    assert got["gpu"].idle_timeout == 120 and got["gpu"].boot_timeout == 600
    assert got["here"].max_instances == 1  # one machine


def test_up_with_a_bad_providers_file_is_one_error_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "slurm.toml"
    bad.write_text('[providers.gpu]\nkind = "slurm"\nmax_instances = -1\n')
    code = cli.main(["up", "--data-dir", str(tmp_path / "d"), "--providers", str(bad)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err
    assert err.startswith(f"gpulayer: error: --providers {bad}: [providers.gpu] max_instances:")
    assert not (tmp_path / "d").exists()  # nothing started
