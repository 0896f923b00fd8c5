"""The Ansible bridge: the agent bundle the playbooks deploy, and playbooks/ run through ansible-runner."""
