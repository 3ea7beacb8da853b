package fencelock

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"
)

func referenceKey(input []byte) int64 {
	sum := sha256.Sum256(input)
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// The key of a fixed input never changes: processes of different versions must agree. The
// golden values were computed once, when the v1 derivation was defined.
func TestSHA256KeyHashGolden(t *testing.T) {
	for _, tc := range []struct {
		ns, name string
		want     int64
	}{
		{"fencelock", "nightly-report", -8853092999619776365},
		{"", "", -3807527027219386769},
	} {
		if got := SHA256KeyHash(tc.ns, tc.name); got != tc.want {
			t.Errorf("SHA256KeyHash(%q, %q) = %d, want %d", tc.ns, tc.name, got, tc.want)
		}
	}
}
