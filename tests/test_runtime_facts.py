"""Runtime facts are data keyed by version: the installed onnxruntime, probed, agrees with
the fixed profile of its release."""

from __future__ import annotations

from importlib import metadata

from dqtool.runtimes import onnxruntime as ort_facts


def test_probe_matches_the_fixed_profile_of_the_installed_release():
    version = metadata.version("onnxruntime")
    probed = ort_facts.probe()
    assert probed.release == version
    release = ort_facts.release_of(version)
    assert release in ort_facts.FIXED, (
        f"onnxruntime {version} has no fixed profile in dqtool.runtimes.onnxruntime.FIXED; "
        f"measured here: {probed.to_json()}")
    fixed = ort_facts.FIXED[release].to_json()
    got = probed.to_json()
    for key in ("release", "source"):
        fixed.pop(key), got.pop(key)
    assert got == fixed


def test_fixed_profiles_say_where_they_were_measured():
    for release, p in ort_facts.FIXED.items():
        assert p.release == release
        assert p.source.startswith(f"measured on onnxruntime {release}.")
    assert ort_facts.FIXED["1.31"].max_opset == 26
    assert ort_facts.FIXED["1.32"].max_opset == 27


def test_installed_version_is_read_without_importing_onnxruntime():
    assert ort_facts.installed_version() == metadata.version("onnxruntime")
    assert ort_facts.release_of("1.32.0") == "1.32"
