"""The live product: the WHIP server, its sessions and their stages."""
