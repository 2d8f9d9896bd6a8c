"""`testbed fleet`: one topology run across an Ansible inventory of hypervisors.

Ansible is the engine (ansible-core, driven from Python by ansible-runner): the inventory,
the fan-out over ssh with host key checking, --forks and --limit are Ansible's. This package
only prepares what Ansible needs (inventory checks, the testbed wheel, the topology), turns
Ansible's events into per-host progress and outcomes, and indexes the fetched runs.

  inventory   list and check the inventory's hosts (trust, per-host topology) before any work
  record      the fleet run record (fleet.json) and the exit statuses
  engine      the ansible-runner call, its events, fetching and indexing
  report      hosts side by side, outliers within a host class
  ansible/    the playbook and the role that prepares a target and runs there
"""
