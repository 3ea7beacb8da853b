package advisory

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// 100,000 names in one namespace get 100,000 distinct keys (a 32-bit hash such as hashtext
// would collide here with probability about 0.69).
func TestSHA256NoCollisionsIn100k(t *testing.T) {
	seen := make(map[int64]string, 100_000)
	for i := range 100_000 {
		name := fmt.Sprintf("payment:%d", i)
		k := SHA256("fencelock", name)
		if prev, dup := seen[k]; dup {
			t.Fatalf("%q and %q share key %d", prev, name, k)
		}
		seen[k] = name
	}
}

// A lock is described by its name and key, or by its key alone; application_name likewise.
func TestDescribeAndApplicationName(t *testing.T) {
	for _, tc := range []struct {
		desc, name   string
		key          Key
		describe, an string
	}{
		{"Named", "nightly-report", Key{Int64: 7}, `"nightly-report" (key 7)`, "fencelock nightly-report"},
		{"Int64Key", "", Key{Int64: -5}, "key -5", "fencelock key -5"},
		{"PairKey", "", Key{Pair: true, K1: 7, K2: 8}, "key (7,8)", "fencelock key (7,8)"},
		{"OverLongName", strings.Repeat("n", 60), Key{}, `"` + strings.Repeat("n", 60) + `" (key 0)`, "fencelock " + strings.Repeat("n", 53)},
		{"CutAtRuneBoundary", "a" + strings.Repeat("é", 30), Key{}, `"a` + strings.Repeat("é", 30) + `" (key 0)`, "fencelock a" + strings.Repeat("é", 26)},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if got := Describe(tc.name, tc.key); got != tc.describe {
				t.Errorf("Describe = %q, want %q", got, tc.describe)
			}
			if got := applicationName(tc.name, tc.key); got != tc.an {
				t.Errorf("applicationName = %q, want %q", got, tc.an)
			}
		})
	}
}

// FuzzApplicationName: what a lock sets application_name to fits Postgres's 63 bytes and stays
// valid UTF-8 for any valid name (1 to 1024 bytes of UTF-8 without NUL, the root package's
// validateName; "" for a lock taken by key).
func FuzzApplicationName(f *testing.F) {
	f.Add("payment:42", int64(7))
	f.Add(strings.Repeat("é", 40), int64(-1))
	f.Fuzz(func(t *testing.T, name string, key int64) {
		if len(name) > 1024 || !utf8.ValidString(name) || strings.IndexByte(name, 0) >= 0 {
			name = ""
		}
		got := applicationName(name, Key{Int64: key})
		if len(got) > 63 || !utf8.ValidString(got) || !strings.HasPrefix(got, "fencelock ") {
			t.Fatalf("applicationName(%q) = %q", name, got)
		}
	})
}
