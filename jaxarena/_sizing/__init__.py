"""Buffer sizing: the seed's composite layouts, `BufferSizes` and global/per-device scaling."""
