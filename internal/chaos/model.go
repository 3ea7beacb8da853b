package chaos

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// registerState is the state of one fenced register: its ledger (entries joined by NUL) and
// its fence's high-water mark. Comparable, so porcupine's default equality works.
type registerState struct {
	ledger string
	hw     int64
}

type appendInput struct {
	value string
	token int64
}

type readInput struct{}

type appendOutput struct {
	outcome Outcome
	stale   bool
	current int64
}

type readOutput struct{ ledger string }

func (s registerState) append(in appendInput) registerState {
	if s.ledger == "" {
		return registerState{in.value, in.token}
	}
	return registerState{s.ledger + "\x00" + in.value, in.token}
}

// RegisterModel is the sequential specification of the fenced register, for porcupine: an
// append with token t succeeds iff t is at least the high-water mark, and then appends its
// entry and raises the mark to t; a stale rejection happens iff t is below the mark and
// reports the mark; another definite failure changes nothing; an unknown outcome may have
// appended (if its token allowed) or not; a read returns the ledger. Histories are
// partitioned by resource.
var RegisterModel = porcupine.NondeterministicModel{
	Partition: partitionByResource,
	Init:      func() []any { return []any{registerState{}} },
	Step: func(state, input, output any) []any {
		s := state.(registerState)
		switch in := input.(type) {
		case readInput:
			if output.(readOutput).ledger == s.ledger {
				return []any{s}
			}
			return nil
		case appendInput:
			out := output.(appendOutput)
			switch {
			case out.outcome == OK:
				if in.token >= s.hw {
					return []any{s.append(in)}
				}
				return nil
			case out.outcome == Fail && out.stale:
				if in.token < s.hw && out.current == s.hw {
					return []any{s}
				}
				return nil
			case out.outcome == Fail:
				return []any{s}
			default: // unknown: it happened or it did not
				if in.token >= s.hw {
					return []any{s, s.append(in)}
				}
				return []any{s}
			}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		switch in := input.(type) {
		case appendInput:
			out := output.(appendOutput)
			return fmt.Sprintf("append(%s, token %d) -> %s stale=%v current=%d", in.value, in.token, out.outcome, out.stale, out.current)
		default:
			return fmt.Sprintf("read() -> [%s]", strings.ReplaceAll(output.(readOutput).ledger, "\x00", " "))
		}
	},
}

func partitionByResource(ops []porcupine.Operation) [][]porcupine.Operation {
	byName := map[string][]porcupine.Operation{}
	var order []string
	for _, op := range ops {
		name := op.Metadata.(string)
		if _, ok := byName[name]; !ok {
			order = append(order, name)
		}
		byName[name] = append(byName[name], op)
	}
	out := make([][]porcupine.Operation, 0, len(order))
	for _, name := range order {
		out = append(out, byName[name])
	}
	return out
}

// RegisterOperations converts the appends and successful reads of h into porcupine
// operations. Pending and unknown appends get a return time after every other operation
// (+infinity): they may take effect at any time after their invocation, or never.
//
// Where h ends with a read of a resource's ledger (see [FinalLedgers]), an unknown or pending
// append to it is resolved by that read before the search, since entries are unique and the
// ledger is append-only: one in the final ledger happened (OK, at some time after its
// invocation), one not in it did not (Fail). This keeps porcupine's search linear in the
// number of unknown outcomes instead of exponential; the outcome itself is still checked, as
// the OK append must fit the model at some point of the order.
func RegisterOperations(h History) []porcupine.Operation {
	var ops []porcupine.Operation
	final := map[string]map[string]bool{}
	for name, entries := range FinalLedgers(h) {
		final[name] = map[string]bool{}
		for _, e := range entries {
			final[name][e] = true
		}
	}
	for _, op := range h {
		if op.Kind == KindAppend && (op.Outcome == Unknown || op.Outcome == Pending) && final[op.Name] != nil {
			if op.Outcome == Pending || final[op.Name][op.Value] {
				op.Return = math.MaxInt64 // it may have taken effect after its caller gave up
			}
			op.Outcome, op.Stale = Fail, false
			if final[op.Name][op.Value] {
				op.Outcome = OK
			}
		}
		client := 0
		for _, c := range op.Worker {
			client = client*31 + int(c)
		}
		client &= 0xffff
		switch {
		case op.Kind == KindAppend:
			ret := int64(op.Return)
			if !op.Finished() {
				ret = math.MaxInt64
			}
			ops = append(ops, porcupine.Operation{
				ClientId: client, Metadata: op.Name,
				Input:  appendInput{op.Value, op.Token},
				Output: appendOutput{op.Outcome, op.Stale, op.Current},
				Call:   int64(op.Invoke), Return: ret,
			})
		case op.Kind == KindRead && op.Outcome == OK:
			ops = append(ops, porcupine.Operation{
				ClientId: client, Metadata: op.Name,
				Input: readInput{}, Output: readOutput{strings.Join(op.Entries, "\x00")},
				Call: int64(op.Invoke), Return: int64(op.Return),
			})
		}
	}
	return ops
}

// Errors of [CheckLinearizable].
var (
	ErrNotLinearizable = errors.New("chaos: fenced register history is not linearizable")
	ErrCheckTimeout    = errors.New("chaos: linearizability check timed out")
)

// CheckLinearizable checks the fenced-register operations of h against [RegisterModel] with
// porcupine, for at most timeout. It returns nil when the history is linearizable, an error
// describing the first illegal partition when it is not, and an error wrapping
// [ErrCheckTimeout] when porcupine ran out of time.
func CheckLinearizable(h History, timeout time.Duration) error {
	ops := RegisterOperations(h)
	model := RegisterModel.ToModel()
	res, info := porcupine.CheckOperationsVerbose(model, ops, timeout)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return fmt.Errorf("%w after %v (%d operations)", ErrCheckTimeout, timeout, len(ops))
	}
	longest := 0
	for _, part := range info.PartialLinearizations() {
		for _, seq := range part {
			longest = max(longest, len(seq))
		}
	}
	return fmt.Errorf("%w: %d operations; longest linearizable prefix of a resource: %d", ErrNotLinearizable, len(ops), longest)
}
