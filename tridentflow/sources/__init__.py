"""Source logs: the interface (``base``) and the file log (``filelog``)."""
