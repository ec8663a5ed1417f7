"""The hosts of a fixed allocation (trainsup/launch/allocation.py): Slurm's host lists, and when
the check is on."""
import pytest

from trainsup.launch.allocation import allocation_hosts, expand_hostlist


def test_slurm_host_lists_expand_as_scontrol_show_hostnames_does():
    assert expand_hostlist("n1") == ["n1"]
    assert expand_hostlist("n[1-3]") == ["n1", "n2", "n3"]
    assert expand_hostlist("n[1-2,5],gpu[08-10]") == ["n1", "n2", "n5", "gpu08", "gpu09", "gpu10"]
    assert expand_hostlist("rack[1-2]-n[01-02]") == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
    assert expand_hostlist("a,b,a") == ["a", "b"]  # each host once


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]"])
def test_a_malformed_host_list_is_an_error_that_quotes_it(bad):
    with pytest.raises(ValueError, match="hostlist"):
        expand_hostlist(bad)


def test_the_allocation_is_slurms_unless_set_and_none_elsewhere():
    assert allocation_hosts({}) is None  # torchrun alone: any host may join
    assert allocation_hosts({"SLURM_JOB_NODELIST": "n[1-2]"}) == ["n1", "n2"]
    assert allocation_hosts({"SLURM_JOB_NODELIST": "n[1-2]", "TRAINSUP_ALLOCATION_HOSTS": "none"}) is None
    assert allocation_hosts({"TRAINSUP_ALLOCATION_HOSTS": "h1,h2,h3"}) == ["h1", "h2", "h3"]
    with pytest.raises(ValueError, match="TRAINSUP_ALLOCATION_HOSTS"):
        allocation_hosts({"TRAINSUP_ALLOCATION_HOSTS": "n[1-"})
