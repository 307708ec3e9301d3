"""The engine is as strict as a pybind11 binding of the SDK, and the
connector lives with that: typed option fields, non-arithmetic enums,
bound containers. Each strictness is one a C++ binding has and Python does
not, so code that passes here does not rely on leniency the vendor SDK lacks.
"""

import pytest
from connector_tools import ConnectorRig

import aibrix_eic.engine as eic


# ------------------------------------------------------------ option fields
@pytest.mark.parametrize(
    "make, field, value",
    [
        (eic.InitOption, "log_dir", None),
        (eic.InitOption, "flag_file", None),
        (eic.InitOption, "log_level", 1),
        (eic.InitOption, "transport_type", 3),
        (eic.SetOption, "ns", None),
        (eic.SetOption, "ttl_second", 1.5),
        (eic.GetOption, "ns", 0),
        (eic.MemoryInfo, "type", 0),
        (eic.MemoryInfo, "cuda_id", None),
    ],
)
def test_option_fields_refuse_values_their_cpp_type_does_not_take(make, field, value):
    option = make()
    before = getattr(option, field)
    with pytest.raises(TypeError, match=f"{make.__name__}.{field}"):
        setattr(option, field, value)
    assert getattr(option, field) == before


def test_option_objects_take_no_undeclared_attribute():
    with pytest.raises(AttributeError):
        eic.InitOption().log_directory = "/tmp"  # a typo the binding would refuse


# ----------------------------------------------------------- open() and them
def test_open_with_no_log_dir_and_no_flag_file_connects():
    """Both default to None in the config; the binding refuses None for a
    std::string field, so the connector must leave such fields unset."""
    rig = ConnectorRig(remote_url="local://typed")
    try:
        assert rig.config.eic_log_dir is None and rig.config.eic_flag_file is None
        status = rig.conn.open()
        assert status.is_ok(), status
        assert rig.conn.health()["connected"]
    finally:
        rig.close()


class _RefusingOption(eic.InitOption):
    """An InitOption whose binding refuses every transport type."""

    def __setattr__(self, name, value):
        if name == "transport_type":
            raise TypeError("InitOption.transport_type: incompatible function arguments")
        super().__setattr__(name, value)


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_binding_error_building_the_sdk_objects_is_an_open_failure_fail_open_honours(monkeypatch, fail_open):
    monkeypatch.setattr(eic, "InitOption", _RefusingOption)
    rig = ConnectorRig(remote_url="local://typed-refusing", fail_open=fail_open, probe_interval_s=60)
    try:
        status = rig.conn.open()
        if fail_open:  # the worker starts; the circuit is open until a probe connects
            assert status.is_ok(), status
            assert rig.conn.health()["breaker"] == "open"
        else:
            assert status.is_error() and "EIC open failed" in str(status.value), status
            assert "InitOption.transport_type" in str(status.value)
    finally:
        rig.close()
