"""Every registered mode's fabric that one host can build without guests: it lists the tb-
objects it made (they exist while it is up) and none is left once it is torn down."""
from __future__ import annotations

import os

import pytest

from testbed import attachments
from testbed.measure import testpaths
from testbed.measure.session import claim_tag
from testbed.topology import config
from testbed.topology.model import Attachment

pytestmark = pytest.mark.netns


@pytest.mark.parametrize("name", [m.name for m in attachments.modes() if m.placement != "two"])
def test_fabric_lists_what_it_made_and_leaves_nothing(name, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates links and namespaces")
    why = attachments.unavailable(name)
    if why:
        pytest.skip(f"attachment {name} unavailable: {why}")
    tag = claim_tag()           # registered: runs beside this test leave its objects alone
    with testpaths.fabric(Attachment(name), tag, config.default(), 1500, tmp_path) as fab:
        made = fab.leftovers()
        assert made and all(n.startswith(f"tb-{tag}-") for n in made), made
        assert attachments.still_here(made) == list(dict.fromkeys(made))
        assert fab.datapath
    assert attachments.still_here(made) == []
