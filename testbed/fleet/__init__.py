"""`testbed fleet`: one topology run across an Ansible inventory of hypervisors.

Ansible is the engine (ansible-core, driven from Python by ansible-runner): the inventory,
the fan-out over ssh with host key checking, --forks and --limit are Ansible's. This package
only prepares what Ansible needs (the inventory as checked, the testbed wheel, each host's
topology, the image), turns Ansible's events into per-host progress and outcomes, and indexes
the fetched runs.

  inventory   the files Ansible reads, read by Ansible (ansread, in a process of its own),
              every host checked before anything connects; the checked copy the run reads
  ansenv      the user's Ansible settings (ansible.cfg, ANSIBLE_*), checked; the run's own
  hostvars    every host variable, by allow-list; host names and their folders
  sshopts     ssh arguments and ssh_config files, parsed as ssh parses them, by allow-list
  pairs       pairs of hosts for two-host topologies, and each pair's topology
  image       the controller's guest image, shipped in checksummed chunks
  record      the fleet run record (fleet.json) and the exit statuses
  fetched     a fetched run archive, checked member by member, then unpacked
  engine      the ansible-runner call, its events, fetching and indexing
  report      hosts side by side, outliers within a host class
  ansible/    the playbook and the role that prepares a target and runs there
"""
