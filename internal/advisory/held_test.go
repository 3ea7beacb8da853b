package advisory

import (
	"testing"
)

type lock struct{ id int }

// A reservation is refused for a key held under the same name, a key held under another name
// (naming it), and past the cap, reservations counting; granted locks are listed, reservations
// not; a lock is forgotten only by itself.
func TestHeld(t *testing.T) {
	h := NewHeld[*lock](2)
	a, b := Key{Int64: 1}, Key{Pair: true, K2: 1}
	if r, _ := h.Reserve("a", a); r != Reserved {
		t.Fatalf("Reserve(a) = %v, want Reserved", r)
	}
	if r, _ := h.Reserve("a", a); r != AlreadyHeld {
		t.Fatalf("Reserve(a) again = %v, want AlreadyHeld", r)
	}
	if r, held := h.Reserve("other", a); r != Collision || held != "a" {
		t.Fatalf("Reserve(other, a's key) = %v, %q; want Collision, \"a\"", r, held)
	}
	if r, _ := h.Reserve("", b); r != Reserved {
		t.Fatalf("Reserve(b) = %v, want Reserved (the pair key (0,1) is not the key 1)", r)
	}
	if r, _ := h.Reserve("c", Key{Int64: 3}); r != Full {
		t.Fatalf("Reserve past the cap = %v, want Full", r)
	}
	if got := h.Granted(); len(got) != 0 {
		t.Fatalf("Granted = %v, want none (reservations only)", got)
	}

	la, stale := &lock{1}, &lock{2}
	h.Grant(a, "a", la)
	if got := h.Granted(); len(got) != 1 || got[0] != la {
		t.Fatalf("Granted = %v, want [a]", got)
	}
	if !h.Forget(a, stale) || h.Len() != 2 {
		t.Fatal("Forget by another lock of the key dropped it")
	}
	if !h.Forget(b, stale) || h.Len() != 2 {
		t.Fatal("Forget dropped a reservation")
	}
	if h.Forget(a, la) || h.Len() != 1 {
		t.Fatalf("Forget(a) left %d keys, or reported a granted lock left", h.Len())
	}
	h.Cancel(b)
	if h.Len() != 0 {
		t.Fatalf("Cancel left %d keys", h.Len())
	}
	if r, _ := h.Reserve("other", a); r != Reserved {
		t.Fatalf("Reserve of a forgotten key = %v, want Reserved", r)
	}
}

// Forget reports whether a granted lock is left, counting grants, not reservations: a key
// granted again (a later lock of it) counts once, and a reservation cancelled leaves the count.
func TestHeldCountsGrants(t *testing.T) {
	h := NewHeld[*lock](4)
	a, b, c := Key{Int64: 1}, Key{Int64: 2}, Key{Int64: 3}
	la, la2, lb := &lock{1}, &lock{2}, &lock{3}
	for _, k := range []Key{a, b, c} {
		if r, _ := h.Reserve("n", k); r != Reserved {
			t.Fatalf("Reserve(%v) = %v", k, r)
		}
	}
	h.Grant(a, "n", la)
	h.Grant(a, "n", la2) // the same key granted again: still one grant
	h.Grant(b, "n", lb)
	h.Cancel(c)
	h.Cancel(a) // not a reservation: stays
	if got := len(h.Granted()); got != 2 {
		t.Fatalf("Granted = %d locks, want 2", got)
	}
	if !h.Forget(a, la2) {
		t.Fatal("Forget(a) reported no grant left; b is granted")
	}
	if h.Forget(b, lb) {
		t.Fatal("Forget(b) reported a grant left; none is")
	}
	if h.Len() != 0 || h.Granted() != nil {
		t.Fatalf("after the last Forget: %d keys, %v granted", h.Len(), h.Granted())
	}
}
