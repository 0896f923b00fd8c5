"""Kernel-side artefacts for the VM lab's guests: out-of-tree modules built against Debian's headers."""
