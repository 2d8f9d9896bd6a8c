"""Guest images and domains: build, boot, restore, agent, NIC and rendering of libvirt XML."""
