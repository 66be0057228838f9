"""Where data rests and how it stops existing: sealed samples and data keys (`crypto`), the
master key (`keystore`), model blobs (`blobs`) and erasure with compaction (`erasure`)."""
