"""ESP flash formats, in one place for the firmware builders, the hardware layer and the simulated
board: ``partitions`` (the partition table: one type, its CSV reader, binary packer and parser, which
app a variant goes to), ``otadata`` (ESP-IDF's otadata and the bootloader's boot rule) and
``model_image`` (esp-check's model partition image)."""
