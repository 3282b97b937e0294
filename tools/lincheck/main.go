// lincheck checks a recorded key-value client history for linearizability
// with porcupine.
//
//	lincheck --history h.json [--visualize out.html] [--timeout 60s]
//
// The history is {"ops": [op, ...]} where each op is
//
//	{"client": 3, "key": "k1", "op": "get"|"set"|"incr",
//	 "value": "c3-17",          (set only)
//	 "output": "..." | null,    (get: the value, null = no such key;
//	                             incr: the new value, or the error text "ERR ...";
//	                             set: ignored)
//	 "call_ns": 123, "return_ns": 456,
//	 "unknown": false}          (true: the client never learned the outcome)
//
// An op with "unknown": true may or may not have taken effect: its output is
// ignored and it is given a return time after every other event of the history
// (porcupine's way of saying "+infinity"). Unknown GETs constrain nothing and
// are dropped.
//
// Exit status: 0 linearizable, 1 NOT linearizable, 2 bad input or usage,
// 3 the checker timed out before deciding.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

const (
	exitOK        = 0
	exitIllegal   = 1
	exitBadInput  = 2
	exitTimedOut  = 3
	errorPrefix   = "ERR" // an INCR output starting with this is an error reply
	maxHistoryLen = 1 << 30
)

// rawOp is one op exactly as it appears in the history file.
type rawOp struct {
	Client   *int            `json:"client"`
	Key      *string         `json:"key"`
	Op       string          `json:"op"`
	Value    *string         `json:"value"`
	Output   json.RawMessage `json:"output"`
	CallNs   *int64          `json:"call_ns"`
	ReturnNs *int64          `json:"return_ns"`
	Unknown  bool            `json:"unknown"`
}

type history struct {
	Ops *[]rawOp `json:"ops"`
}

// input is what porcupine hands the model as an operation's input.
type input struct {
	op    string // "get", "set", "incr"
	key   string
	value string // set only
}

// output is what porcupine hands the model as an operation's output.
type output struct {
	unknown bool   // outcome never learned: any output is acceptable
	isNil   bool   // get: the key did not exist
	val     string // get: the value; incr: the new value or an error text
}

// state is the value of one key (the history is partitioned by key).
type state struct {
	present bool
	val     string
}

// redisInt parses v the way redis's INCR does: a canonical decimal int64.
func redisInt(v string) (int64, bool) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || strconv.FormatInt(n, 10) != v {
		return 0, false
	}
	return n, true
}

func step(st, in, out interface{}) (bool, interface{}) {
	s := st.(state)
	i := in.(input)
	o := out.(output)
	switch i.op {
	case "get":
		if o.unknown {
			return true, s
		}
		if o.isNil {
			return !s.present, s
		}
		return s.present && s.val == o.val, s
	case "set":
		return true, state{present: true, val: i.value}
	case "incr":
		cur := int64(0)
		ok := true
		if s.present {
			cur, ok = redisInt(s.val)
		}
		if !ok || cur == math.MaxInt64 {
			// Redis refuses: the value is unchanged and the client gets an error.
			return o.unknown || (!o.isNil && strings.HasPrefix(o.val, errorPrefix)), s
		}
		next := state{present: true, val: strconv.FormatInt(cur+1, 10)}
		return o.unknown || (!o.isNil && o.val == next.val), next
	}
	return false, s
}

func describeOp(in, out interface{}) string {
	i := in.(input)
	o := out.(output)
	res := ""
	switch {
	case o.unknown:
		res = " -> ?"
	case i.op == "set":
	case o.isNil:
		res = " -> nil"
	default:
		res = " -> " + strconv.Quote(o.val)
	}
	if i.op == "set" {
		return fmt.Sprintf("set(%s, %q)%s", i.key, i.value, res)
	}
	return fmt.Sprintf("%s(%s)%s", i.op, i.key, res)
}

func describeState(st interface{}) string {
	s := st.(state)
	if !s.present {
		return "nil"
	}
	return strconv.Quote(s.val)
}

func hashState(st interface{}) uint64 {
	s := st.(state)
	h := fnv.New64a()
	if s.present {
		h.Write([]byte{1})
		h.Write([]byte(s.val))
	}
	return h.Sum64()
}

func partitionByKey(ops []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range ops {
		k := op.Input.(input).key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, byKey[k])
	}
	return parts
}

var kvModel = porcupine.Model{
	Partition:         partitionByKey,
	Init:              func() interface{} { return state{} },
	Step:              step,
	Hash:              hashState,
	DescribeOperation: describeOp,
	DescribeState:     describeState,
}

// summary counts what load() read, for the report line.
type summary struct {
	ops, keys, unknown, droppedGets int
}

// load reads and validates a history file and turns it into porcupine ops.
func load(path string) ([]porcupine.Operation, summary, error) {
	var sum summary
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, sum, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var h history
	if err := dec.Decode(&h); err != nil {
		return nil, sum, fmt.Errorf("%s: not a history: %v", path, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, sum, fmt.Errorf("%s: trailing data after the JSON object", path)
	}
	if h.Ops == nil {
		return nil, sum, fmt.Errorf(`%s: no "ops" array`, path)
	}
	raw := *h.Ops
	if len(raw) > maxHistoryLen {
		return nil, sum, fmt.Errorf("%s: too many ops (%d)", path, len(raw))
	}

	// Validate, and find the last timestamp of the history.
	maxT := int64(math.MinInt64)
	keys := map[string]bool{}
	clients := map[int]bool{}
	for n, r := range raw {
		bad := func(format string, a ...interface{}) error {
			return fmt.Errorf("%s: op %d: %s", path, n, fmt.Sprintf(format, a...))
		}
		switch {
		case r.Client == nil:
			return nil, sum, bad(`missing "client"`)
		case *r.Client < 0:
			return nil, sum, bad(`"client" must be >= 0, got %d`, *r.Client)
		case r.Key == nil:
			return nil, sum, bad(`missing "key"`)
		case r.CallNs == nil:
			return nil, sum, bad(`missing "call_ns"`)
		}
		switch r.Op {
		case "set":
			if r.Value == nil {
				return nil, sum, bad(`set without a "value"`)
			}
		case "get", "incr":
			if r.Value != nil {
				return nil, sum, bad(`%s takes no "value"`, r.Op)
			}
		case "":
			return nil, sum, bad(`missing "op"`)
		default:
			return nil, sum, bad(`unknown op %q (want get, set or incr)`, r.Op)
		}
		if !r.Unknown {
			if r.ReturnNs == nil {
				return nil, sum, bad(`missing "return_ns" (and not "unknown": true)`)
			}
			if *r.ReturnNs < *r.CallNs {
				return nil, sum, bad("return_ns %d is before call_ns %d", *r.ReturnNs, *r.CallNs)
			}
			if *r.ReturnNs > maxT {
				maxT = *r.ReturnNs
			}
			if r.Op != "set" {
				if len(r.Output) == 0 {
					return nil, sum, bad(`%s without an "output"`, r.Op)
				}
				var s *string
				if err := json.Unmarshal(r.Output, &s); err != nil {
					return nil, sum, bad(`"output" must be a string or null`)
				}
				if s == nil && r.Op == "incr" {
					return nil, sum, bad(`incr "output" must be a string`)
				}
			}
		}
		if *r.CallNs > maxT {
			maxT = *r.CallNs
		}
		keys[*r.Key] = true
		clients[*r.Client] = true
	}
	if maxT == math.MaxInt64 {
		return nil, sum, fmt.Errorf("%s: timestamps too large", path)
	}
	sum.ops, sum.keys = len(raw), len(keys)

	// porcupine's visualization wants dense, zero-based client ids.
	ids := make([]int, 0, len(clients))
	for c := range clients {
		ids = append(ids, c)
	}
	sort.Ints(ids)
	dense := map[int]int{}
	for i, c := range ids {
		dense[c] = i
	}

	ops := make([]porcupine.Operation, 0, len(raw))
	for _, r := range raw {
		in := input{op: r.Op, key: *r.Key}
		if r.Value != nil {
			in.value = *r.Value
		}
		var out output
		ret := int64(0)
		if r.Unknown {
			sum.unknown++
			if r.Op == "get" {
				sum.droppedGets++
				continue
			}
			out.unknown = true
			ret = maxT + 1 // after everything: it may take effect at any later time, or never
		} else {
			ret = *r.ReturnNs
			if r.Op != "set" {
				var s *string
				_ = json.Unmarshal(r.Output, &s) // validated above
				if s == nil {
					out.isNil = true
				} else {
					out.val = *s
				}
			}
		}
		ops = append(ops, porcupine.Operation{
			ClientId: dense[*r.Client],
			Input:    in,
			Call:     *r.CallNs,
			Output:   out,
			Return:   ret,
		})
	}
	return ops, sum, nil
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: lincheck --history FILE.json [--visualize OUT.html] [--timeout 60s]")
	fmt.Fprintln(w, "exit status: 0 linearizable, 1 NOT linearizable, 2 bad input, 3 timed out")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lincheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(stderr); fs.PrintDefaults() }
	histPath := fs.String("history", "", "history JSON file (required)")
	vizPath := fs.String("visualize", "", "write porcupine's HTML visualization here")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long (0: never)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitBadInput
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lincheck: unexpected argument %q\n", fs.Arg(0))
		usage(stderr)
		return exitBadInput
	}
	if *histPath == "" {
		fmt.Fprintln(stderr, "lincheck: --history is required")
		usage(stderr)
		return exitBadInput
	}
	if *timeout < 0 {
		fmt.Fprintln(stderr, "lincheck: --timeout must be >= 0")
		return exitBadInput
	}

	ops, sum, err := load(*histPath)
	if err != nil {
		fmt.Fprintf(stderr, "lincheck: %v\n", err)
		return exitBadInput
	}

	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(kvModel, ops, *timeout)
	took := time.Since(start).Round(time.Millisecond)

	if *vizPath != "" {
		if err := porcupine.VisualizePath(kvModel, info, *vizPath); err != nil {
			fmt.Fprintf(stderr, "lincheck: writing %s: %v\n", *vizPath, err)
		} else {
			fmt.Fprintf(stderr, "lincheck: visualization in %s\n", *vizPath)
		}
	}
	detail := fmt.Sprintf("(%d with unknown outcome, of which %d GETs, dropped; checked in %v)",
		sum.unknown, sum.droppedGets, took)
	switch res {
	case porcupine.Ok:
		fmt.Fprintf(stdout, "linearizable: %d ops, %d keys %s\n", sum.ops, sum.keys, detail)
		return exitOK
	case porcupine.Illegal:
		fmt.Fprintf(stdout, "NOT linearizable: %d ops, %d keys %s\n", sum.ops, sum.keys, detail)
		return exitIllegal
	default:
		fmt.Fprintf(stdout, "UNKNOWN: the checker timed out after %v: %d ops, %d keys %s\n",
			*timeout, sum.ops, sum.keys, detail)
		return exitTimedOut
	}
}
