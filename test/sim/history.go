package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// The history checker: every read and write of the protected object, as its
// clients saw it (sent, answered or never answered), must be linearizable
// against a sequential fenced register. The register holds the fence, grant,
// segment and payload of the last accepted write, and accepts a write only
// if it carries a higher fence starting at segment 1, or the same grant's next
// segment. Reads return the register.

// registerState is the fenced register's value.
type registerState struct {
	// Absent: the object does not exist; a deleted object keeps the fence
	// state it was deleted with (the registry remembers it).
	Absent  bool
	Fence   int64
	Grant   string // digest of the grant document
	Segment int64
	Payload string
}

type registerInput struct {
	Write  bool
	Delete bool
	Valid  bool // the write carries a readable fence annotation
	Value  registerState
	// AfterLostDelete: sent while a registry restore had taken back the
	// record of the object's deletion (docs/security.md, Known limits): its
	// segments may start over.
	AfterLostDelete bool
}

type writeOutcome int

const (
	outcomeUnknown        writeOutcome = iota // no answer reached the client
	outcomeAccepted                           // written
	outcomeUnchanged                          // allowed, but the object was already exactly this
	outcomeRejected                           // denied or refused (conflict, not found); nothing changed
	outcomeAlreadyApplied                     // denied as a replay of an applied segment
)

type registerOutput struct {
	Outcome writeOutcome
	Read    registerState
}

type history struct {
	ops      []porcupine.Operation
	answered []bool
}

func newHistory() *history { return &history{} }

// call records a read or write leaving its client.
func (h *history) call(w *world, r *request, tick int64) int {
	in := registerInput{}
	switch r.kind {
	case reqWriteObject:
		in.Write = true
		in.Value, in.Valid = w.registerOf(r.object)
		in.AfterLostDelete = w.oracle.deletedMemoryLost
	case reqDeleteObject:
		in.Delete = true
	}
	h.ops = append(h.ops, porcupine.Operation{Input: in, Call: tick, Return: math.MaxInt64})
	h.answered = append(h.answered, false)
	return len(h.ops) - 1
}

// decidedAfterLostDelete marks write i as decided while a registry restore
// had taken back the record of the object's deletion: the flag taken when it
// left its client is not enough, since a restore may come before the webhook
// decides it (a replay sent just before the restore re-creates the object).
func (h *history) decidedAfterLostDelete(i int) {
	if i < 0 {
		return
	}
	in := h.ops[i].Input.(registerInput)
	in.AfterLostDelete = true
	h.ops[i].Input = in
}

// ret records the answer reaching its client.
func (h *history) ret(w *world, rp *reply, tick int64) {
	i := rp.req.historyOp
	out := registerOutput{}
	if rp.req.kind == reqGetObject {
		out.Read, _ = w.registerOf(rp.object)
	} else {
		switch {
		case rp.status == replyOK && rp.verdict == fence.Unchanged:
			out.Outcome = outcomeUnchanged
		case rp.status == replyOK:
			out.Outcome = outcomeAccepted
		case rp.verdict == fence.AlreadyApplied:
			out.Outcome = outcomeAlreadyApplied
		default:
			out.Outcome = outcomeRejected
		}
	}
	h.ops[i].Output, h.ops[i].Return = out, tick
	h.answered[i] = true
}

// registerOf reads the register value an object holds: its fence
// annotation if that carries a grant the registry issued for this resource;
// any other fence state counts for nothing (the zero value).
func (w *world) registerOf(obj map[string]any) (registerState, bool) {
	if obj == nil {
		return registerState{Absent: true}, true
	}
	raw := annotations(obj)[fence.AnnotationFence]
	if raw == "" {
		return registerState{}, true
	}
	e, err := w.readEnvelope(raw)
	if err != nil || len(raw) > fence.MaxFenceAnnotationBytes {
		return registerState{}, false
	}
	if _, genuine := w.oracle.issued[string(e.Grant)]; !genuine || e.grant.Resource != resourceID {
		return registerState{}, true
	}
	return registerState{Fence: e.grant.FenceToken, Grant: e.digest, Segment: e.Segment, Payload: e.Payload}, true
}

// follows is the register's acceptance rule.
func follows(s, w registerState) bool {
	return (w.Fence > s.Fence && w.Segment == 1) || (w.Fence == s.Fence && w.Grant == s.Grant && w.Segment == s.Segment+1)
}

var registerModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{registerState{Absent: true}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(registerState), input.(registerInput), output.(registerOutput)
		switch {
		case in.Delete:
			return deleteStep(s, out.Outcome)
		case !in.Write && out.Read.Absent:
			if s.Absent {
				return []any{s}
			}
			return nil
		case !in.Write:
			if out.Read == s {
				return []any{s}
			}
			return nil
		}
		w := in.Value
		switch out.Outcome {
		case outcomeRejected:
			return []any{s}
		case outcomeUnknown: // it may or may not have taken effect
			if in.Valid && (follows(s, w) || recreatesAfterLostDelete(s, in)) {
				return []any{s, w}
			}
			return []any{s}
		case outcomeAccepted:
			if in.Valid && follows(s, w) {
				return []any{w}
			}
			if in.Valid && recreatesAfterLostDelete(s, in) {
				return []any{w}
			}
			if in.Valid && w == (registerState{}) && s.Fence == 0 {
				// An unfenced write before any fence: the documented
				// index-lag window (the oracle judges when it may happen).
				return []any{w}
			}
		case outcomeUnchanged:
			if in.Valid && s == w {
				return []any{s}
			}
		case outcomeAlreadyApplied:
			if in.Valid && s.Fence == w.Fence && s.Segment >= w.Segment {
				return []any{s}
			}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(registerInput), output.(registerOutput)
		switch {
		case in.Delete:
			return fmt.Sprintf("delete -> %d", out.Outcome)
		case !in.Write:
			return fmt.Sprintf("read -> fence %d seg %d absent %t", out.Read.Fence, out.Read.Segment, out.Read.Absent)
		}
		return fmt.Sprintf("write fence %d seg %d -> %d", in.Value.Fence, in.Value.Segment, out.Outcome)
	},
}).ToModel()

// recreatesAfterLostDelete: a first segment re-creating the object after a
// registry restore took back the record of its deletion starts over from the
// restored registry (docs/security.md, Known limits), whatever the answer.
func recreatesAfterLostDelete(s registerState, in registerInput) bool {
	return in.AfterLostDelete && s.Absent && in.Value.Segment == 1
}

// deleteStep: an accepted delete makes the object absent, keeping its
// fence state; a refused one changes nothing.
func deleteStep(s registerState, o writeOutcome) []any {
	gone := s
	gone.Absent = true
	switch {
	case o == outcomeRejected:
		return []any{s}
	case s.Absent:
		return nil // nothing to delete: the apiserver answers NotFound
	case o == outcomeUnknown:
		return []any{s, gone}
	case o == outcomeAccepted:
		return []any{gone}
	}
	return nil
}

// check runs the linearizability check on the schedule's history. Reads that
// were never answered constrain nothing and are left out; writes that were
// never answered stay open to the end (they may have taken effect).
func (h *history) check(w *world) {
	ops := make([]porcupine.Operation, 0, len(h.ops))
	for i, op := range h.ops {
		if h.answered[i] {
			ops = append(ops, op)
			continue
		}
		if in := op.Input.(registerInput); in.Write || in.Delete {
			op.Output = registerOutput{Outcome: outcomeUnknown}
			op.Return = w.tick + 1
			ops = append(ops, op)
		}
	}
	switch porcupine.CheckOperationsTimeout(registerModel, ops, 20*time.Second) {
	case porcupine.Ok:
	case porcupine.Illegal:
		w.oracle.violation(vNotLinearizable, "the %d reads and writes of the protected object are not linearizable as a fenced register", len(ops))
	default:
		w.res.LinearizabilityUnknown++
		w.oracle.violation(vNotLinearizable, "the linearizability check of %d operations timed out", len(ops))
	}
}
