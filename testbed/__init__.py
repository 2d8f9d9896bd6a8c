"""VM-to-VM networking testbed for KVM hypervisors.

Public surface: ``testbed.api`` (the Python API) and the pytest plugin's options, markers
and fixtures (``testbed.pytest_plugin``, docs/tests.md). Every other module is private: its
names may change in any release."""

__version__ = "0.2.0"

#: Every host object the testbed creates carries this prefix; cleanup removes only these.
PREFIX = "tb-"
