"""Kernels tcplab builds: variants from source into Debian packages (spec, sources, builder, cache, commands;
docs/kernels.md) and out-of-tree modules against Debian's packaged headers for the VM lab (modbuild,
debian_modules; docs/modules.md)."""
