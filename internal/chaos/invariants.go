package chaos

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Violation is one breach of an invariant, found in a history.
type Violation struct {
	Invariant string // the function that found it
	Op        int    // the operation at fault, or -1
	Detail    string
}

func (v Violation) String() string { return fmt.Sprintf("%s: op #%d: %s", v.Invariant, v.Op, v.Detail) }

// FinalLedgers returns, per resource, the entries of the last successful read of its ledger
// (by invocation time). Scenarios end with such a read, after every worker has stopped.
func FinalLedgers(h History) map[string][]string {
	out := map[string][]string{}
	last := map[string]time.Duration{}
	for _, op := range h {
		if op.Kind == KindRead && op.Outcome == OK {
			if t, ok := last[op.Name]; !ok || op.Invoke >= t {
				out[op.Name], last[op.Name] = op.Entries, op.Invoke
			}
		}
	}
	return out
}

// EntryToken returns the token of a ledger entry "(worker,token,opid)", or 0 if malformed.
func EntryToken(entry string) int64 {
	parts := strings.Split(strings.Trim(entry, "()"), ",")
	if len(parts) != 3 {
		return 0
	}
	t, _ := strconv.ParseInt(parts[1], 10, 64)
	return t
}

// TokensNeverDecrease checks that, in every final ledger, the tokens of successive entries
// never decrease: fenced writes to one resource commit in token order.
func TokensNeverDecrease(h History) []Violation {
	var vs []Violation
	for name, entries := range FinalLedgers(h) {
		prev := int64(0)
		for i, e := range entries {
			t := EntryToken(e)
			if t < prev {
				vs = append(vs, Violation{"TokensNeverDecrease", -1, fmt.Sprintf("ledger %q entry %d %s has token %d after %d", name, i, e, t, prev)})
			}
			prev = max(prev, t)
		}
	}
	return vs
}

// GrantTokensUnique checks that no two successful grants, of any name, share a token: tokens
// come from one sequence.
func GrantTokensUnique(h History) []Violation {
	var vs []Violation
	seen := map[int64]int{}
	for _, op := range h {
		if op.Kind != KindGrant || op.Outcome != OK {
			continue
		}
		if prev, ok := seen[op.Token]; ok {
			vs = append(vs, Violation{"GrantTokensUnique", op.ID, fmt.Sprintf("token %d granted to %s (%s) and before to %s (%s)", op.Token, op.Holder, op.Name, h[prev].Holder, h[prev].Name)})
			continue
		}
		seen[op.Token] = op.ID
	}
	return vs
}

// NoAckedWriteLost checks that every acknowledged append is in its final ledger.
func NoAckedWriteLost(h History) []Violation {
	var vs []Violation
	final := FinalLedgers(h)
	for _, op := range h {
		if op.Kind == KindAppend && op.Outcome == OK && count(final[op.Name], op.Value) == 0 {
			vs = append(vs, Violation{"NoAckedWriteLost", op.ID, fmt.Sprintf("acknowledged append %s missing from ledger %q", op.Value, op.Name)})
		}
	}
	return vs
}

// NoFailedWriteApplied checks that no append that definitely failed is in its final ledger.
func NoFailedWriteApplied(h History) []Violation {
	var vs []Violation
	final := FinalLedgers(h)
	for _, op := range h {
		if op.Kind == KindAppend && op.Outcome == Fail && count(final[op.Name], op.Value) > 0 {
			vs = append(vs, Violation{"NoFailedWriteApplied", op.ID, fmt.Sprintf("failed append %s (%s) found in ledger %q", op.Value, op.Err, op.Name)})
		}
	}
	return vs
}

// AppliedAtMostOnce checks that every ledger entry appears at most once and was appended by a
// recorded operation (an unknown outcome may be there once, or not at all).
func AppliedAtMostOnce(h History) []Violation {
	var vs []Violation
	known := map[string]bool{}
	for _, op := range h {
		if op.Kind == KindAppend {
			known[op.Name+"\x00"+op.Value] = true
		}
	}
	for name, entries := range FinalLedgers(h) {
		seen := map[string]bool{}
		for _, e := range entries {
			if seen[e] {
				vs = append(vs, Violation{"AppliedAtMostOnce", -1, fmt.Sprintf("entry %s twice in ledger %q", e, name)})
			}
			seen[e] = true
			if !known[name+"\x00"+e] {
				vs = append(vs, Violation{"AppliedAtMostOnce", -1, fmt.Sprintf("entry %s in ledger %q was never appended", e, name)})
			}
		}
	}
	return vs
}

// StaleRejectChangedNothing checks every append rejected with a stale token: its entry is not
// in the ledger, the high-water mark it reported is larger than its token and is the token of
// an entry in the ledger, and fences[resource] (the final high-water mark) is the largest
// token in the ledger, so no rejection moved the fence.
func StaleRejectChangedNothing(h History, fences map[string]int64) []Violation {
	var vs []Violation
	final := FinalLedgers(h)
	tokens := map[string]map[int64]bool{}
	for name, entries := range final {
		tokens[name] = map[int64]bool{}
		top := int64(0)
		for _, e := range entries {
			tokens[name][EntryToken(e)] = true
			top = max(top, EntryToken(e))
		}
		if hw, ok := fences[name]; ok && hw != top {
			vs = append(vs, Violation{"StaleRejectChangedNothing", -1, fmt.Sprintf("fence of %q is %d, largest token in its ledger %d", name, hw, top)})
		}
	}
	for _, op := range h {
		if op.Kind != KindAppend || !op.Stale {
			continue
		}
		switch {
		case op.Outcome != Fail:
			vs = append(vs, Violation{"StaleRejectChangedNothing", op.ID, "stale rejection recorded as " + op.Outcome.String()})
		case count(final[op.Name], op.Value) > 0:
			vs = append(vs, Violation{"StaleRejectChangedNothing", op.ID, fmt.Sprintf("rejected append %s is in ledger %q", op.Value, op.Name)})
		case op.Current <= op.Token:
			vs = append(vs, Violation{"StaleRejectChangedNothing", op.ID, fmt.Sprintf("rejected token %d but reported mark %d is not newer", op.Token, op.Current)})
		case !tokens[op.Name][op.Current]:
			vs = append(vs, Violation{"StaleRejectChangedNothing", op.ID, fmt.Sprintf("reported mark %d of %q is the token of no write in its ledger", op.Current, op.Name)})
		}
	}
	return vs
}

// TrustWithinExpiry checks that every validity check that found a lease held (KindCheck, OK)
// was made no later, on the database clock, than the lease's server-side expiry as the holder
// knew it; and that every Done closing (KindDone) was seen no later than that expiry plus
// slack (the delay of observing it), except for workers a fault paused or killed: a stopped
// process closes nothing, and there the fence is the guard. A grant whose reply reached the
// holder only after the lease's expiry (a delayed reply) cannot close Done earlier than that:
// its Done must close within slack of the grant's return instead. A Done's own Op.Late (the
// scheduler's delay a control timer saw meanwhile) is added to slack.
func TrustWithinExpiry(h History, slack time.Duration) []Violation {
	var vs []Violation
	faulted := map[string]bool{}
	type grantKey struct {
		worker string
		token  int64
	}
	granted := map[grantKey]time.Time{}
	for _, op := range h {
		if op.Kind == KindFault && op.Worker != "" {
			faulted[op.Worker] = true
		}
		if op.Kind == KindGrant && op.Outcome == OK {
			granted[grantKey{op.Worker, op.Token}] = op.ServerReturn
		}
	}
	for _, op := range h {
		if op.Expires.IsZero() {
			continue
		}
		switch {
		case op.Kind == KindCheck && op.Outcome == OK && op.ServerInvoke.After(op.Expires):
			vs = append(vs, Violation{"TrustWithinExpiry", op.ID, fmt.Sprintf("%s trusted lease %q (token %d) %v after its server-side expiry", op.Worker, op.Name, op.Token, op.ServerInvoke.Sub(op.Expires))})
		case op.Kind == KindDone && !faulted[op.Worker] && op.ServerReturn.After(laterOf(op.Expires, granted[grantKey{op.Worker, op.Token}]).Add(slack+op.Late)):
			vs = append(vs, Violation{"TrustWithinExpiry", op.ID, fmt.Sprintf("%s saw Done of %q (token %d) close %v after its server-side expiry, a control timer %v late meanwhile (Err: %s)", op.Worker, op.Name, op.Token, op.ServerReturn.Sub(op.Expires), op.Late, op.Err)})
		}
	}
	return vs
}

// laterOf returns the later of a and b.
func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TakeoverTimes returns, for every fault that killed a holder (KindFault with Name set), the
// time from the fault to the next successful grant of Name invoked after it; faults never
// followed by a grant get -1.
func TakeoverTimes(h History) []time.Duration {
	var out []time.Duration
	for _, f := range h {
		if f.Kind != KindFault || f.Name == "" {
			continue
		}
		best := time.Duration(-1)
		for _, g := range h {
			if g.Kind == KindGrant && g.Outcome == OK && g.Name == f.Name && g.Return >= f.Return && (best < 0 || g.Return-f.Return < best) {
				best = g.Return - f.Return
			}
		}
		out = append(out, best)
	}
	return out
}

// TakeoverWithinBound checks that after every fault that killed a holder of a name, the name
// was granted again within bound (the TTL plus the retry bound of waiting acquirers).
func TakeoverWithinBound(h History, bound time.Duration) []Violation {
	var vs []Violation
	times := TakeoverTimes(h)
	j := 0
	for _, f := range h {
		if f.Kind != KindFault || f.Name == "" {
			continue
		}
		d := times[j]
		j++
		if d < 0 || d > bound {
			vs = append(vs, Violation{"TakeoverWithinBound", f.ID, fmt.Sprintf("after %s, %q granted again after %v (bound %v; -1: never)", f.Value, f.Name, d, bound)})
		}
	}
	return vs
}

// CheckRegister runs every fenced-register invariant on h, with fences the final high-water
// marks, and the linearizability check with timeout.
func CheckRegister(h History, fences map[string]int64, slack, timeout time.Duration) []Violation {
	var vs []Violation
	vs = append(vs, TokensNeverDecrease(h)...)
	vs = append(vs, GrantTokensUnique(h)...)
	vs = append(vs, NoAckedWriteLost(h)...)
	vs = append(vs, NoFailedWriteApplied(h)...)
	vs = append(vs, AppliedAtMostOnce(h)...)
	vs = append(vs, StaleRejectChangedNothing(h, fences)...)
	vs = append(vs, TrustWithinExpiry(h, slack)...)
	if err := CheckLinearizable(h, timeout); err != nil {
		vs = append(vs, Violation{"CheckLinearizable", -1, err.Error()})
	}
	return vs
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}
