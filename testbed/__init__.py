"""VM-to-VM networking testbed for KVM hypervisors."""

__version__ = "0.2.0"

#: Every host object the testbed creates carries this prefix; cleanup removes only these.
PREFIX = "tb-"
