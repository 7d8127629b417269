package wire

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/slowrank/slowrank/detector"
)

// ErrInvalid is wrapped by every rejection of a record.
var ErrInvalid = errors.New("invalid slowrank fact record")

// Fact is one decoded fact. Its times are still on the sender's clock.
type Fact struct {
	// Host is the sender (slowrank.host).
	Host string
	// SentMono is the sender's CLOCK_MONOTONIC when the request left
	// (slowrank.sent_mono_ns); 0 when the sender did not say.
	SentMono int64
	// Exactly one of Step and Topology is set.
	Step     *detector.Step
	Topology *detector.Topology
}

// Limits bound what one request may make the decoder accept and allocate:
// the aggregator's receiver passes its own (aggregate.ServerConfig.Limits).
type Limits struct {
	MaxRecords       int // records (log records or spans) per request (default 65536)
	MaxAttributes    int // attributes per record (default 64)
	MaxString        int // bytes of a job, host or fingerprint (default 256)
	MaxPhases        int // phases per step (default 16)
	MaxTopologyBytes int // bytes of a topology body (default 1 MiB)
	MaxTopologyRanks int // ranks, and members of all groups, per topology (default 1<<17)
	MaxGroups        int // groups per topology (default 4096)
}

// MaxRank is the highest rank number accepted (exclusive).
const MaxRank = 1 << 24

// maxStepSpanNS bounds a step's length (24 h).
const maxStepSpanNS = int64(24 * 3600 * 1e9)

// maxPhaseMS bounds a phase value (about 11.6 days).
const maxPhaseMS = 1e9

// maxTokens is the detector's bound on a step's token count.
const maxTokens = detector.MaxTokens

// WithDefaults fills the zero limits with their defaults (the numbers above).
func (l Limits) WithDefaults() Limits {
	if l.MaxRecords <= 0 {
		l.MaxRecords = 1 << 16
	}
	if l.MaxAttributes <= 0 {
		l.MaxAttributes = 64
	}
	if l.MaxString <= 0 {
		l.MaxString = 256
	}
	if l.MaxPhases <= 0 {
		l.MaxPhases = 16
	}
	if l.MaxTopologyBytes <= 0 {
		l.MaxTopologyBytes = 1 << 20
	}
	if l.MaxTopologyRanks <= 0 {
		l.MaxTopologyRanks = 1 << 17
	}
	if l.MaxGroups <= 0 {
		l.MaxGroups = 4096
	}
	return l
}

// Decoded is what one request yielded.
type Decoded struct {
	Facts []Fact
	// Rejected counts slowrank records that failed validation (reported to
	// the sender as OTLP partial success); FirstErr is the first reason.
	Rejected int
	FirstErr error
	// Ignored counts records that are not slowrank facts (no slowrank.kind,
	// a kind this version does not know, spans other than train.step).
	Ignored int
}

// Reject counts one more rejected record with reason err: the decoder's
// own rejections, and the receiver's later ones (a host its client
// certificate does not name), so that one partial-success answer tells them
// all.
func (d *Decoded) Reject(err error) {
	d.Rejected++
	if d.FirstErr == nil {
		d.FirstErr = err
	}
}

// DecodeLogs decodes the fact records of an OTLP logs request (the schema of
// doc.go). Each record is validated on its own: an invalid record is
// rejected and counted, its neighbours are kept. Beyond lim.MaxRecords the
// rest is rejected. It never panics on any input.
func DecodeLogs(ld plog.Logs, lim Limits) Decoded {
	lim = lim.WithDefaults()
	var d Decoded
	seen := 0
	rls := ld.ResourceLogs()
	for i := 0; i < rls.Len(); i++ {
		rl := rls.At(i)
		job, jobErr := resourceJob(rl.Resource().Attributes(), lim)
		sls := rl.ScopeLogs()
		for j := 0; j < sls.Len(); j++ {
			sl := sls.At(j)
			sent, sentErr := scopeSent(sl.Scope().Attributes())
			lrs := sl.LogRecords()
			for k := 0; k < lrs.Len(); k++ {
				seen++
				lr := lrs.At(k)
				kind, ok := lr.Attributes().Get(AttrKind)
				if !ok {
					d.Ignored++
					continue
				}
				if seen > lim.MaxRecords {
					d.Reject(fmt.Errorf("%w: more than %d records in one request", ErrInvalid, lim.MaxRecords))
					continue
				}
				if kind.Type() != pcommon.ValueTypeStr {
					d.Reject(fmt.Errorf("%w: %s must be a string", ErrInvalid, AttrKind))
					continue
				}
				switch kind.Str() {
				case KindStep, KindTopology:
				default:
					d.Ignored++
					continue
				}
				if jobErr != nil {
					d.Reject(jobErr)
					continue
				}
				if sentErr != nil {
					d.Reject(sentErr)
					continue
				}
				var f Fact
				var err error
				if kind.Str() == KindStep {
					f, err = decodeStepAttrs(lr.Attributes(), job, lim)
				} else {
					f, err = decodeTopology(lr, job, lim)
				}
				if err == nil && f.Step != nil && sent > 0 && sent < f.Step.EndNS {
					err = fmt.Errorf("%w: %s %d is after %s %d (one clock: impossible)", ErrInvalid,
						AttrEndNS, f.Step.EndNS, AttrSentMonoNS, sent)
				}
				if err == nil && f.Step != nil && sent > 0 && sent-f.Step.EndNS > int64(MaxFactAge) {
					// A fact that old is past every window's lateness; an age
					// this large is a broken or hostile clock that would put
					// the step far outside the job's timeline.
					err = fmt.Errorf("%w: %s %d is %s after %s %d (at most %s)", ErrInvalid, AttrSentMonoNS, sent,
						time.Duration(sent-f.Step.EndNS), AttrEndNS, f.Step.EndNS, MaxFactAge)
				}
				if err != nil {
					d.Reject(err)
					continue
				}
				f.SentMono = sent
				d.Facts = append(d.Facts, f)
			}
		}
	}
	return d
}

func resourceJob(attrs pcommon.Map, lim Limits) (string, error) {
	v, ok := attrs.Get(AttrJob)
	if !ok {
		return "", fmt.Errorf("%w: resource without %s", ErrInvalid, AttrJob)
	}
	if v.Type() != pcommon.ValueTypeStr {
		return "", fmt.Errorf("%w: resource %s must be a string", ErrInvalid, AttrJob)
	}
	if err := checkString(AttrJob, v.Str(), lim); err != nil {
		return "", err
	}
	return v.Str(), nil
}

// MaxFactAge is the oldest a step fact may be when its sender sends it
// (sent_mono_ns - end_ns): far past any window's lateness, and short enough
// that no clock error can move a step out of its job's timeline.
const MaxFactAge = time.Hour

func scopeSent(attrs pcommon.Map) (int64, error) {
	v, ok := attrs.Get(AttrSentMonoNS)
	if !ok {
		return 0, nil
	}
	if v.Type() != pcommon.ValueTypeInt || v.Int() < 0 || v.Int() >= detector.MaxTimeNS {
		return 0, fmt.Errorf("%w: scope %s must be an int in [0, 2^62)", ErrInvalid, AttrSentMonoNS)
	}
	return v.Int(), nil
}

// checkString accepts 1..MaxString bytes of valid UTF-8 without control
// characters.
func checkString(name, s string, lim Limits) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalid, name)
	}
	if len(s) > lim.MaxString {
		return fmt.Errorf("%w: %s is %d bytes (limit %d)", ErrInvalid, name, len(s), lim.MaxString)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, name)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: %s contains a control character", ErrInvalid, name)
		}
	}
	return nil
}

// maxGPUIndex bounds a placement's NVML index (far beyond any host's GPUs).
const maxGPUIndex = 1 << 16

// checkPlacement validates a rank's placement, every field of which is
// optional (agents before it sent none): a string that is given must pass
// checkString, as it becomes a span attribute and a metric label.
func checkPlacement(p *detector.Placement, lim Limits) error {
	for _, f := range [...]struct{ name, v string }{
		{"k8s.pod_name", p.K8s.PodName}, {"k8s.pod_uid", p.K8s.PodUID}, {"k8s.namespace", p.K8s.Namespace},
		{"k8s.container_name", p.K8s.ContainerName}, {"container_id", p.ContainerID},
		{"slurm.job_id", p.Slurm.JobID}, {"slurm.step_id", p.Slurm.StepID},
		{"gpu.uuid", p.GPU.UUID}, {"gpu.pci_bus_id", p.GPU.PCIBusID},
	} {
		if f.v == "" {
			continue
		}
		if err := checkString(f.name, f.v, lim); err != nil {
			return err
		}
	}
	if p.GPU.Index < 0 || p.GPU.Index >= maxGPUIndex {
		return fmt.Errorf("%w: gpu.index %d out of range [0, %d)", ErrInvalid, p.GPU.Index, maxGPUIndex)
	}
	return nil
}

// validPhaseName accepts [a-z0-9_]{1,32}.
func validPhaseName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Field bits for required and duplicate checks.
const (
	fHost = 1 << iota
	fRank
	fStep
	fStart
	fEnd
	fGPU
	fTopo
	fEpoch
	fFP
	fTokens
	fLast
	fLag
	fDevLast
	fDevLag
	fDevColl
	fJob
	fKind
)

// stepDecoder turns the attributes of one record (log record or span)
// into a Step; it is shared by DecodeLogs and DecodeTraces.
type stepDecoder struct {
	lim     Limits
	s       detector.Step
	host    string
	job     string
	seen    int
	phases  int
	err     error
	spanned bool // times come from the span, not from attributes
}

func (sd *stepDecoder) fail(format string, args ...any) bool {
	sd.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
	return false
}

func (sd *stepDecoder) once(bit int, key string) bool {
	if sd.seen&bit != 0 {
		return sd.fail("attribute %s given twice", key)
	}
	sd.seen |= bit
	return true
}

func (sd *stepDecoder) intAttr(bit int, key string, v pcommon.Value, lo, hi int64) (int64, bool) {
	if !sd.once(bit, key) {
		return 0, false
	}
	if v.Type() != pcommon.ValueTypeInt {
		return 0, sd.fail("%s must be an int, got %s", key, v.Type())
	}
	n := v.Int()
	if n < lo || n > hi {
		return 0, sd.fail("%s = %d out of range [%d, %d]", key, n, lo, hi)
	}
	return n, true
}

// msAttr decodes a duration attribute given at most once: a finite,
// non-negative number of milliseconds.
func (sd *stepDecoder) msAttr(f int, k string, v pcommon.Value) (*float64, bool) {
	if !sd.once(f, k) {
		return nil, false
	}
	x, isNum := number(v)
	if !isNum || !(x >= 0) || x > maxPhaseMS {
		return nil, sd.fail("%s must be a finite, non-negative number of ms", k)
	}
	return &x, true
}

func (sd *stepDecoder) boolAttr(bit int, key string, v pcommon.Value) (bool, bool) {
	if !sd.once(bit, key) {
		return false, false
	}
	if v.Type() != pcommon.ValueTypeBool {
		return false, sd.fail("%s must be a bool, got %s", key, v.Type())
	}
	return v.Bool(), true
}

func (sd *stepDecoder) strAttr(bit int, key string, v pcommon.Value) (string, bool) {
	if !sd.once(bit, key) {
		return "", false
	}
	if v.Type() != pcommon.ValueTypeStr {
		return "", sd.fail("%s must be a string, got %s", key, v.Type())
	}
	if err := checkString(key, v.Str(), sd.lim); err != nil {
		sd.err = err
		return "", false
	}
	return v.Str(), true
}

func number(v pcommon.Value) (float64, bool) {
	switch v.Type() {
	case pcommon.ValueTypeDouble:
		return v.Double(), true
	case pcommon.ValueTypeInt:
		return float64(v.Int()), true
	}
	return 0, false
}

// attr handles one attribute; it returns false to stop at the first error.
func (sd *stepDecoder) attr(k string, v pcommon.Value) bool {
	const i31 = math.MaxInt32
	var ok bool
	switch k {
	case AttrKind:
		return sd.once(fKind, k)
	case AttrJob:
		sd.job, ok = sd.strAttr(fJob, k, v)
	case AttrHost:
		sd.host, ok = sd.strAttr(fHost, k, v)
	case AttrRank:
		var n int64
		n, ok = sd.intAttr(fRank, k, v, 0, MaxRank-1)
		sd.s.Rank = int(n)
	case AttrStep:
		sd.s.Step, ok = sd.intAttr(fStep, k, v, 0, math.MaxInt64)
	case AttrStartNS:
		if sd.spanned {
			return true
		}
		sd.s.StartNS, ok = sd.intAttr(fStart, k, v, 0, math.MaxInt64)
	case AttrEndNS:
		if sd.spanned {
			return true
		}
		sd.s.EndNS, ok = sd.intAttr(fEnd, k, v, 0, math.MaxInt64)
	case AttrGPU:
		sd.s.GPU, ok = sd.boolAttr(fGPU, k, v)
	case AttrTopo:
		var n int64
		n, ok = sd.intAttr(fTopo, k, v, 0, i31)
		sd.s.Topo = int(n)
	case AttrEpoch:
		var n int64
		n, ok = sd.intAttr(fEpoch, k, v, 0, i31)
		sd.s.Epoch = int(n)
	case AttrWorkloadFP:
		var fp string
		if fp, ok = sd.strAttr(fFP, k, v); ok {
			sd.workload().FP = fp
		}
	case AttrWorkloadTokens:
		var n int64
		if n, ok = sd.intAttr(fTokens, k, v, 0, maxTokens); ok {
			sd.workload().Tokens = n
		}
	case AttrLastArrival:
		var b bool
		if b, ok = sd.boolAttr(fLast, k, v); ok {
			sd.s.LastArrival = &b
		}
	case AttrArrivalLagMS:
		sd.s.ArrivalLagMS, ok = sd.msAttr(fLag, k, v)
	case AttrDevLast:
		var b bool
		if b, ok = sd.boolAttr(fDevLast, k, v); ok {
			sd.s.DeviceLastArrival = &b
		}
	case AttrDevLagMS:
		sd.s.DeviceArrivalLagMS, ok = sd.msAttr(fDevLag, k, v)
	case AttrDevCollMS:
		sd.s.DeviceCollMS, ok = sd.msAttr(fDevColl, k, v)
	default:
		name, isPhase := strings.CutPrefix(k, PhaseAttrPrefix)
		if !isPhase {
			return true // another attribute: ignored
		}
		name, isPhase = strings.CutSuffix(name, PhaseAttrSuffix)
		if !isPhase {
			return true // slowrank.phase.name etc. on other spans
		}
		if !validPhaseName(name) {
			return sd.fail("phase attribute %q: name must match [a-z0-9_]{1,32}", k)
		}
		x, isNum := number(v)
		if !isNum || !(x >= 0) || x > maxPhaseMS {
			return sd.fail("%s must be a finite, non-negative number of ms", k)
		}
		if sd.s.Phases == nil {
			sd.s.Phases = make(map[string]float64, 4)
		}
		if _, dup := sd.s.Phases[name]; dup {
			return sd.fail("attribute %s given twice", k)
		}
		if sd.phases++; sd.phases > sd.lim.MaxPhases {
			return sd.fail("more than %d phases", sd.lim.MaxPhases)
		}
		sd.s.Phases[name] = x
		ok = true
	}
	return ok
}

func (sd *stepDecoder) workload() *detector.Workload {
	if sd.s.Workload == nil {
		sd.s.Workload = &detector.Workload{}
	}
	return sd.s.Workload
}

// finish checks the required fields and the step's invariants.
func (sd *stepDecoder) finish(required int) (*detector.Step, error) {
	if sd.err != nil {
		return nil, sd.err
	}
	if missing := required &^ sd.seen; missing != 0 {
		for _, f := range []struct {
			bit  int
			name string
		}{{fHost, AttrHost}, {fRank, AttrRank}, {fStep, AttrStep},
			{fStart, AttrStartNS}, {fEnd, AttrEndNS}, {fJob, AttrJob}} {
			if missing&f.bit != 0 {
				return nil, fmt.Errorf("%w: missing attribute %s", ErrInvalid, f.name)
			}
		}
	}
	s := &sd.s
	if s.EndNS < s.StartNS {
		return nil, fmt.Errorf("%w: end %d before start %d", ErrInvalid, s.EndNS, s.StartNS)
	}
	if s.EndNS-s.StartNS > maxStepSpanNS {
		return nil, fmt.Errorf("%w: step lasts %d ns (limit 24 h)", ErrInvalid, s.EndNS-s.StartNS)
	}
	if s.Phases == nil {
		s.Phases = map[string]float64{}
	}
	if s.Workload != nil && s.Workload.FP == "" && s.Workload.Tokens == 0 {
		s.Workload = nil
	}
	s.Kind = detector.KindStep
	s.Host = sd.host
	return s, nil
}

func decodeStepAttrs(attrs pcommon.Map, job string, lim Limits) (Fact, error) {
	if attrs.Len() > lim.MaxAttributes {
		return Fact{}, fmt.Errorf("%w: %d attributes (limit %d)", ErrInvalid, attrs.Len(), lim.MaxAttributes)
	}
	sd := stepDecoder{lim: lim}
	attrs.Range(sd.attr)
	s, err := sd.finish(fHost | fRank | fStep | fStart | fEnd)
	if err != nil {
		return Fact{}, err
	}
	if sd.seen&fJob != 0 && sd.job != job {
		return Fact{}, fmt.Errorf("%w: record %s %q differs from its resource's %q", ErrInvalid, AttrJob, sd.job, job)
	}
	s.Job = job
	return Fact{Host: sd.host, Step: s}, nil
}

func decodeTopology(lr plog.LogRecord, job string, lim Limits) (Fact, error) {
	attrs := lr.Attributes()
	if attrs.Len() > lim.MaxAttributes {
		return Fact{}, fmt.Errorf("%w: %d attributes (limit %d)", ErrInvalid, attrs.Len(), lim.MaxAttributes)
	}
	hv, ok := attrs.Get(AttrHost)
	if !ok || hv.Type() != pcommon.ValueTypeStr {
		return Fact{}, fmt.Errorf("%w: topology record without string %s", ErrInvalid, AttrHost)
	}
	host := hv.Str()
	if err := checkString(AttrHost, host, lim); err != nil {
		return Fact{}, err
	}
	body := lr.Body()
	if body.Type() != pcommon.ValueTypeStr {
		return Fact{}, fmt.Errorf("%w: topology body must be the JSON fact as a string", ErrInvalid)
	}
	if len(body.Str()) > lim.MaxTopologyBytes {
		return Fact{}, fmt.Errorf("%w: topology body of %d bytes (limit %d)", ErrInvalid, len(body.Str()), lim.MaxTopologyBytes)
	}
	v, err := detector.DecodeFact([]byte(body.Str()))
	if err != nil {
		return Fact{}, fmt.Errorf("%w: topology body: %w", ErrInvalid, err)
	}
	t, ok := v.(*detector.Topology)
	if !ok {
		return Fact{}, fmt.Errorf("%w: topology record whose body is a %T", ErrInvalid, v)
	}
	if t.Job != job {
		return Fact{}, fmt.Errorf("%w: topology of job %q under resource of job %q", ErrInvalid, t.Job, job)
	}
	if t.Version < 0 {
		return Fact{}, fmt.Errorf("%w: negative topology version %d", ErrInvalid, t.Version)
	}
	if vv, ok := attrs.Get(AttrTopo); ok && (vv.Type() != pcommon.ValueTypeInt || vv.Int() != int64(t.Version)) {
		return Fact{}, fmt.Errorf("%w: %s differs from the body's version %d", ErrInvalid, AttrTopo, t.Version)
	}
	if len(t.Groups) > lim.MaxGroups {
		return Fact{}, fmt.Errorf("%w: %d groups (limit %d)", ErrInvalid, len(t.Groups), lim.MaxGroups)
	}
	n := len(t.Ranks)
	for i := range t.Ranks {
		r := &t.Ranks[i]
		if r.Rank < 0 || r.Rank >= MaxRank {
			return Fact{}, fmt.Errorf("%w: topology rank %d out of range", ErrInvalid, r.Rank)
		}
		if r.Host == "" {
			r.Host = host
		} else if err := checkString("topology rank host", r.Host, lim); err != nil {
			return Fact{}, err
		}
		if err := checkPlacement(&r.Placement, lim); err != nil {
			return Fact{}, fmt.Errorf("topology rank %d: %w", r.Rank, err)
		}
	}
	for _, g := range t.Groups {
		if err := checkString("topology group id", g.ID, lim); err != nil {
			return Fact{}, err
		}
		if len(g.Type) > lim.MaxString {
			return Fact{}, fmt.Errorf("%w: group type of %d bytes", ErrInvalid, len(g.Type))
		}
		n += len(g.Ranks)
		for _, r := range g.Ranks {
			if r >= MaxRank {
				return Fact{}, fmt.Errorf("%w: group %q rank %d out of range", ErrInvalid, g.ID, r)
			}
		}
	}
	if n > lim.MaxTopologyRanks {
		return Fact{}, fmt.Errorf("%w: topology lists %d ranks and members (limit %d)", ErrInvalid, n, lim.MaxTopologyRanks)
	}
	return Fact{Host: host, Topology: t}, nil
}

// DecodeTraces decodes train.step spans (as the agent's OTel exporter
// writes them, export/spans.go) into step facts: job, rank, step, host and
// phases from the span's attributes (job and host fall back to the
// resource's slowrank.job.id and host.name), duration from the span's
// timestamps. Spans carry no send time, so the aggregator takes their
// receive time as their end. Other spans are ignored.
func DecodeTraces(td ptrace.Traces, lim Limits) Decoded {
	lim = lim.WithDefaults()
	var d Decoded
	seen := 0
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		res := rs.Resource().Attributes()
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			spans := sss.At(j).Spans()
			for k := 0; k < spans.Len(); k++ {
				seen++
				sp := spans.At(k)
				if sp.Name() != SpanStep {
					d.Ignored++
					continue
				}
				if seen > lim.MaxRecords {
					d.Reject(fmt.Errorf("%w: more than %d records in one request", ErrInvalid, lim.MaxRecords))
					continue
				}
				f, err := decodeStepSpan(sp, res, lim)
				if err != nil {
					d.Reject(err)
					continue
				}
				d.Facts = append(d.Facts, f)
			}
		}
	}
	return d
}

func decodeStepSpan(sp ptrace.Span, res pcommon.Map, lim Limits) (Fact, error) {
	attrs := sp.Attributes()
	if attrs.Len() > lim.MaxAttributes {
		return Fact{}, fmt.Errorf("%w: %d attributes (limit %d)", ErrInvalid, attrs.Len(), lim.MaxAttributes)
	}
	sd := stepDecoder{lim: lim, spanned: true}
	attrs.Range(sd.attr)
	if sd.err == nil && sd.seen&fJob == 0 {
		if job, err := resourceJob(res, lim); err == nil {
			sd.job, sd.seen = job, sd.seen|fJob
		}
	}
	if sd.err == nil && sd.seen&fHost == 0 {
		if v, ok := res.Get("host.name"); ok && v.Type() == pcommon.ValueTypeStr && checkString("host.name", v.Str(), lim) == nil {
			sd.host, sd.seen = v.Str(), sd.seen|fHost
		}
	}
	start, end := int64(sp.StartTimestamp()), int64(sp.EndTimestamp())
	if start < 0 || end < start {
		return Fact{}, fmt.Errorf("%w: span ends before it starts", ErrInvalid)
	}
	sd.s.StartNS, sd.s.EndNS = start, end
	s, err := sd.finish(fHost | fRank | fStep | fJob)
	if err != nil {
		return Fact{}, err
	}
	s.Job = sd.job
	return Fact{Host: sd.host, Step: s}, nil
}
