import pytest

from kvcost.core.registry import Registry


def test_register_and_get():
    reg: Registry = Registry("thing")
    reg.add("a", 1)
    assert reg.get("a") == 1
    assert reg.names() == ["a"]
    assert "a" in reg


def test_duplicate_name_is_an_error():
    reg: Registry = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(ValueError, match="duplicate thing name 'a'"):
        reg.add("a", 2)
    assert reg.get("a") == 1


def test_items_keep_registration_order_while_names_are_sorted():
    reg: Registry = Registry("thing")
    reg.add("b", 1)
    reg.add("a", 2)
    assert reg.items() == [("b", 1), ("a", 2)]
    assert reg.names() == list(reg) == ["a", "b"]


def test_unknown_name_lists_known():
    reg: Registry = Registry("thing")
    reg.add("b", 1)
    with pytest.raises(KeyError, match="unknown thing 'z'; expected one of: b"):
        reg.get("z")
