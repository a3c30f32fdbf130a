"""Tests for kvcost.features.spec (FEATURE_SPEC, feature_spec_hash)."""

from dataclasses import replace

from kvcost.core.types import TIER_CODES
from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES, FEATURE_SPEC, feature_spec_hash

#: Changing this literal is a schema change: trained models stop loading. Update it on purpose only.
CURRENT_SPEC_HASH = "cc9fd22ffead0566"


def test_hash_is_stable():
    assert feature_spec_hash() == CURRENT_SPEC_HASH
    assert feature_spec_hash(FEATURE_SPEC) == feature_spec_hash(tuple(FEATURE_SPEC))


def with_feature(i, **changes):
    spec = list(FEATURE_SPEC)
    spec[i] = replace(spec[i], **changes)
    return tuple(spec)


def test_hash_changes_on_rename_retype_reunit_reorder():
    i = FEATURE_INDEX["nominal_queue_s"]
    assert feature_spec_hash(with_feature(i, name="nominal_wait_s")) != CURRENT_SPEC_HASH
    assert feature_spec_hash(with_feature(i, dtype="BIGINT")) != CURRENT_SPEC_HASH
    assert feature_spec_hash(with_feature(i, unit="ms")) != CURRENT_SPEC_HASH
    assert feature_spec_hash(FEATURE_SPEC[::-1]) != CURRENT_SPEC_HASH
    assert feature_spec_hash(FEATURE_SPEC[:-1]) != CURRENT_SPEC_HASH


def test_hash_ignores_descriptions():
    assert feature_spec_hash(with_feature(0, description="reworded")) == CURRENT_SPEC_HASH


def test_names_index_and_dtypes():
    assert len(FEATURE_SPEC) == 29
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)
    assert [FEATURE_INDEX[n] for n in FEATURE_NAMES] == list(range(29))
    assert {f.dtype for f in FEATURE_SPEC} == {"BIGINT", "DOUBLE"}
    assert all(f.name.endswith("_s") for f in FEATURE_SPEC if f.unit == "s")
    assert TIER_CODES == {"none": 0, "gpu": 1, "cpu": 2, "disk": 3, "remote": 4}
