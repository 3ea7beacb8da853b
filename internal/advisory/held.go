package advisory

// Refusal says why [Held.Reserve] refused a key, or that it did not.
type Refusal int

const (
	// Reserved: the key was free and is now reserved.
	Reserved Refusal = iota
	// AlreadyHeld: the key is held, or being acquired, under the same name.
	AlreadyHeld
	// Collision: the key is held, or being acquired, under another name.
	Collision
	// Full: the set holds its cap of keys.
	Full
)

// Held is the set of session locks of one locker, by key: those granted, of type L, and
// reservations for acquires under way. A locker is not re-entrant, and caps its session locks
// (each holds a pooled connection). Held is not safe for concurrent use: its owner guards it
// with its own mutex (the one that also guards its watchdog loop).
type Held[L comparable] struct {
	max     int
	m       map[Key]heldEntry[L]
	granted int // entries of m with granted set
}

type heldEntry[L comparable] struct {
	name    string
	lock    L
	granted bool // false: reserved by an acquire under way
}

// NewHeld returns an empty set that holds at most max keys (granted and reserved), max >= 1.
func NewHeld[L comparable](max int) *Held[L] {
	return &Held[L]{max: max, m: make(map[Key]heldEntry[L])}
}

// Len returns how many keys the set has, granted and reserved.
func (h *Held[L]) Len() int { return len(h.m) }

// Reserve claims key for an acquire under name, or says why it cannot: [AlreadyHeld],
// [Collision] with the name that holds the key, or [Full]. It reports [Reserved] and "" when
// it claimed the key.
func (h *Held[L]) Reserve(name string, key Key) (r Refusal, heldName string) {
	if e, ok := h.m[key]; ok {
		if e.name != name {
			return Collision, e.name
		}
		return AlreadyHeld, ""
	}
	if len(h.m) >= h.max {
		return Full, ""
	}
	h.m[key] = heldEntry[L]{name: name}
	return Reserved, ""
}

// Cancel drops the reservation of key, whose acquire failed.
func (h *Held[L]) Cancel(key Key) {
	if e, ok := h.m[key]; ok && !e.granted {
		delete(h.m, key)
	}
}

// Grant records lock, granted under name, in place of the reservation of key.
func (h *Held[L]) Grant(key Key, name string, lock L) {
	if e, ok := h.m[key]; !ok || !e.granted {
		h.granted++
	}
	h.m[key] = heldEntry[L]{name: name, lock: lock, granted: true}
}

// Forget drops key if it is held by lock (not by a later grant, nor a reservation), and
// reports whether any granted lock is left. O(1).
func (h *Held[L]) Forget(key Key, lock L) (anyGranted bool) {
	if e, ok := h.m[key]; ok && e.granted && e.lock == lock {
		delete(h.m, key)
		h.granted--
	}
	return h.granted > 0
}

// Granted returns the granted locks, in no order (not the reservations).
func (h *Held[L]) Granted() []L {
	if h.granted == 0 {
		return nil
	}
	locks := make([]L, 0, h.granted)
	for _, e := range h.m {
		if e.granted {
			locks = append(locks, e.lock)
		}
	}
	return locks
}
