"""What is to be measured: the topology a user writes, read and validated into frozen records."""
