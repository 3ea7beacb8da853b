package fencelock

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzValidateName: a name is accepted exactly when it is 1 to MaxNameLength bytes of valid
// UTF-8 without NUL, and every refusal is an *ArgumentError.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"", "a", "payment:42", "pay\x00ment", "\xff", "é", strings.Repeat("x", MaxNameLength), strings.Repeat("x", MaxNameLength+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want := len(name) >= 1 && len(name) <= MaxNameLength && utf8.ValidString(name) && strings.IndexByte(name, 0) < 0
		err := validateName("name", name)
		if (err == nil) != want {
			t.Fatalf("validateName(%q) = %v, want accepted=%v", name, err, want)
		}
		if err != nil {
			if _, ok := err.(*ArgumentError); !ok {
				t.Fatalf("validateName(%q) returned %T, want *ArgumentError", name, err)
			}
		}
	})
}

// FuzzSHA256KeyHash: the key is the documented function of its input, and the length prefixes
// keep apart the splits of one string into namespace and name.
func FuzzSHA256KeyHash(f *testing.F) {
	f.Add("fencelock", "payment:42", 3)
	f.Add("", "", 0)
	f.Add("ab", "c", 1)
	f.Fuzz(func(t *testing.T, ns, name string, split int) {
		k := SHA256KeyHash(ns, name)
		if k != SHA256KeyHash(ns, name) {
			t.Fatal("not deterministic")
		}
		// The documented encoding, spelled out independently.
		var buf bytes.Buffer
		buf.WriteString("fencelock/advisory-key/v1")
		buf.WriteByte(0)
		buf.Write(binary.AppendUvarint(nil, uint64(len(ns))))
		buf.WriteString(ns)
		buf.Write(binary.AppendUvarint(nil, uint64(len(name))))
		buf.WriteString(name)
		if want := referenceKey(buf.Bytes()); k != want {
			t.Fatalf("SHA256KeyHash(%q, %q) = %d, want %d", ns, name, k, want)
		}
		// Moving the boundary between namespace and name changes the encoded input, so the
		// key differs (a 64-bit collision here would be a 2^-64 event).
		joined := ns + name
		if split < 0 {
			split = -split
		}
		if len(joined) > 0 {
			s := split % (len(joined) + 1)
			if s != len(ns) && SHA256KeyHash(joined[:s], joined[s:]) == k {
				t.Fatalf("(%q,%q) and (%q,%q) share key %d", ns, name, joined[:s], joined[s:], k)
			}
		}
	})
}
