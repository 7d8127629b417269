package detector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrUnknownKind reports a JSONL fact of a kind this version does not know.
// Readers count and skip such facts: newer producers may add kinds.
var ErrUnknownKind = errors.New("unknown fact kind")

// maxLineBytes bounds one JSONL fact; longer lines are rejected.
const maxLineBytes = 1 << 20

// DecodeFact decodes one JSONL line into a *Step or a *Topology. Unknown
// fields are accepted (the contract may grow); missing required fields,
// wrong types and invalid values are errors that say which field.
func DecodeFact(line []byte) (any, error) {
	if len(line) > maxLineBytes {
		return nil, fmt.Errorf("line of %d bytes exceeds the %d byte limit", len(line), maxLineBytes)
	}
	var head struct {
		Kind *string `json:"kind"`
	}
	if err := json.Unmarshal(line, &head); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if head.Kind == nil {
		return nil, errors.New(`missing field "kind"`)
	}
	switch *head.Kind {
	case KindStep:
		return decodeStep(line)
	case KindTopology:
		return decodeTopology(line)
	default:
		return nil, fmt.Errorf("%w %q", ErrUnknownKind, *head.Kind)
	}
}

func decodeStep(line []byte) (*Step, error) {
	var s Step
	if err := strictUnmarshal(line, &s); err != nil {
		return nil, err
	}
	if err := requireFields(line, "job", "rank", "step", "end_ns", "phases"); err != nil {
		return nil, err
	}
	if err := validateStep(s); err != nil {
		return nil, err
	}
	return &s, nil
}

func decodeTopology(line []byte) (*Topology, error) {
	var t Topology
	if err := strictUnmarshal(line, &t); err != nil {
		return nil, err
	}
	if err := requireFields(line, "job", "version"); err != nil {
		return nil, err
	}
	if t.Job == "" {
		return nil, errors.New(`field "job" must not be empty`)
	}
	for _, g := range t.Groups {
		if g.ID == "" {
			return nil, errors.New(`topology group without "id"`)
		}
		for _, r := range g.Ranks {
			if r < 0 {
				return nil, fmt.Errorf("topology group %q has negative rank %d", g.ID, r)
			}
		}
	}
	return &t, nil
}

func strictUnmarshal(line []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("field %q: want %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// requireFields checks that each named top-level field is present and not null.
func requireFields(line []byte, names ...string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return err
	}
	for _, n := range names {
		if v, ok := m[n]; !ok || string(v) == "null" {
			return fmt.Errorf("missing field %q", n)
		}
	}
	return nil
}
