package selfmetrics

// Components that report series (Metric.Component, Source.Components).
const (
	Agent     = "agent"     // agent/: discovery, attach, ring buffer, correlator, detector, duty cycle
	Library   = "cupti"     // the injection library's own statistics, summed by the agent (cupti_lib_*)
	Outputs   = "jsonl"     // the agent's JSONL files (cmd/slowrank)
	Export    = "export"    // the OTLP exporter (export.Exporter)
	Forward   = "forward"   // the fact forwarder to an aggregator (forward.Forwarder)
	Aggregate = "aggregate" // slowrank aggregate
	Process   = "process"   // CPU and memory of the slowrank process (/proc/self)
	Webhook   = "webhook"   // slowrank webhook (agent/admission)
)

// Loss metrics: every record that slowrank drops, sees late or twice, by
// reason or stage. The Grafana dashboard and the alert rules query these.
const (
	RecordsDropped   = "slowrank.records.dropped"
	RecordsLate      = "slowrank.records.late"
	RecordsDuplicate = "slowrank.records.duplicate"
	AttachErrors     = "slowrank.attach.errors"
	ExportDropped    = "slowrank.export.dropped"
	// Undeclared is where a key that the table does not declare goes
	// (attribute name=KEY): exported, never dropped; tests fail on it.
	Undeclared = "slowrank.component.events"
)

// Table is every self-metric of slowrank. Order is documentation order.
var Table = []Metric{
	// Losses.
	{Name: RecordsDropped, Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "Capture records lost before they became step facts, by reason.", Series: []Series{
			s("ringbuf_lost", "reason", "ringbuf_full"),            // BPF ring buffer full (bpf stats)
			s("events_lost_queue", "reason", "queue_full"),         // the agent's input queue full
			s("events_malformed", "reason", "malformed"),           // undecodable ring-buffer events
			s("events_unknown", "reason", "unknown_event"),         // events of a kind the agent does not convert
			s("device_records_dropped", "reason", "library_queue"), // dropped by the injection library (batch header)
			s("device_records_implausible", "reason", "implausible_time"),
			s("correlate_evicted", "reason", "correlate_evicted"),   // per-rank state evicted
			s("correlate_dropped_host", "reason", "correlate_host"), // host intervals beyond the correlator's bounds
			s("correlate_dropped_device", "reason", "correlate_device"),
			// The NCCL profiler plugin's path (agent/capture/convert_nccl.go, cupti/slowrank_nccl.c).
			s("nccl_plugin_records_before_comm", "reason", "nccl_before_comm"), // collectives of a process with no comm record yet (its uprobes report them)
			s("nccl_plugin_records_implausible", "reason", "nccl_implausible_time"),
			s("nccl_kernel_records_off_plugin", "reason", "nccl_kernel_off_plugin"), // kernels of calls the uprobes report (or not fed): nothing to join them to
			s("nccl_kernel_records_p2p", "reason", "nccl_kernel_p2p"),               // p2p kernels: no sequence number names their call
			s("nccl_kernel_records_clock_suspect", "reason", "nccl_kernel_clock_suspect"),
			s("correlate_kernels_unmatched", "reason", "nccl_kernel_unmatched"),  // their call never came, or its arrival row was gone
			s("nccl_plugin_reorder_overflow", "reason", "nccl_reorder_overflow"), // held calls released early: a process held more than 65,536
			{Key: "cupti_lib_nccl_ring_full", Attrs: []string{"reason", "nccl_ring_full"}, Component: Library},
			{Key: "cupti_lib_nccl_incomplete", Attrs: []string{"reason", "nccl_kernel_incomplete"}, Component: Library},
		}},
	{Name: RecordsLate, Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "Records or step facts that arrived after their step or window was settled, by stage.", Series: []Series{
			s("correlate_late", "stage", "correlate"),
			s("nccl_plugin_records_late", "stage", "nccl_plugin_reorder"), // a plugin record later than the 400 ms hold
			s("detector_late", "stage", "detector"),
			s("detector_late_after_swap", "stage", "detector_swap"),
			{Key: "aggregate_late", Attrs: []string{"stage", "aggregate"}, Component: Aggregate},
		}},
	{Name: RecordsDuplicate, Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "Duplicate records or step facts ignored, by stage.", Series: []Series{
			s("correlate_duplicate", "stage", "correlate"),
			s("detector_duplicates", "stage", "detector"),
			// A call both NCCL capture paths saw around a process's switch to the plugin.
			s("nccl_uprobe_events_superseded", "stage", "nccl_uprobes"),
			// An ncclBcast around the ncclBroadcast it calls: one broadcast, both uprobes fired.
			s("nccl_uprobe_nested_calls", "stage", "nccl_uprobes_nested"),
			s("nccl_plugin_records_superseded", "stage", "nccl_plugin"),
		}},
	{Name: AttachErrors, Kind: Counter, Unit: "{attachment}", Component: Agent,
		Desc: "Libraries whose uprobes could not be attached.", Series: []Series{s("attach_errors")}},
	{Name: "slowrank.agent.attach.refused", Kind: Counter, Unit: "{attachment}", Component: Agent,
		Desc: "Library files refused because their path opened another file than the one the process maps (renamed into place after the maps read), by use: uprobes (attach and re-attach), control_block (the injection library's symbols, read to find its control block).", Series: []Series{
			s("attach_files_refused", "use", "uprobes"),
			s("inject_files_refused", "use", "control_block"),
		}},
	{Name: "slowrank.agent.library.opens", Kind: Counter, Unit: "{open}", Component: Agent,
		Desc: "Library files opened to read their symbols, by use (uprobes: attach and re-attach; control_block: the injection library) and how: map_files (the process's mapping itself, /proc/PID/map_files) or path (where map_files could not be opened, without CAP_SYS_ADMIN or once the mapping went away: the path, checked against the mapping's device and inode, which before Linux 6.8 refuses files on overlayfs).", Series: []Series{
			s("attach_opened_map_files", "use", "uprobes", "via", "map_files"),
			s("attach_opened_path", "use", "uprobes", "via", "path"),
			s("inject_opened_map_files", "use", "control_block", "via", "map_files"),
			s("inject_opened_path", "use", "control_block", "via", "path"),
		}},

	// Ring buffer and probes.
	{Name: "slowrank.agent.events.read", Kind: Counter, Unit: "{event}", Component: Agent,
		Desc: "Ring-buffer events read.", Series: []Series{s("events")}},
	{Name: "slowrank.agent.events.decoded", Kind: Counter, Unit: "{event}", Component: Agent,
		Desc: "Ring-buffer events decoded.", Series: []Series{s("events_decoded")}},
	{Name: "slowrank.agent.ringbuf.read.errors", Kind: Counter, Unit: "{error}", Component: Agent,
		Desc: "Errors reading the ring buffer.", Series: []Series{s("read_errors")}},
	{Name: "slowrank.agent.shutdown.read_timeouts", Kind: Counter, Unit: "{event}", Component: Agent,
		Desc: "Stops at which the ring-buffer reader did not finish in time.", Series: []Series{s("shutdown_read_timeout")}},
	{Name: "slowrank.agent.probe.events", Kind: Counter, Unit: "{event}", Component: Agent,
		Desc: "Events per probe (uprobe traps are these times one or two).", Series: []Series{{Key: "probe_*", Suffix: "probe"}}},
	{Name: "slowrank.agent.input.queue.length", Kind: Gauge, Unit: "{event}", Component: Agent,
		Desc: "Events waiting in the agent's input queue.", Series: []Series{s("input_queue_len")}},
	{Name: "slowrank.agent.device.latency", Kind: Gauge, Unit: "s", Component: Agent,
		Desc: "From a device record's end to the agent reading it, by percentile.", Series: []Series{
			{Key: "device_latency_p50_us", Attrs: []string{"percentile", "p50"}, Scale: 1e-6},
			{Key: "device_latency_p99_us", Attrs: []string{"percentile", "p99"}, Scale: 1e-6},
		}},

	// Discovery and attachment.
	{Name: "slowrank.agent.processes", Kind: Gauge, Unit: "{process}", Component: Agent,
		Desc: "Training processes watched.", Series: []Series{s("processes")}},
	{Name: "slowrank.agent.processes.tracked", Kind: Gauge, Unit: "{process}", Component: Agent,
		Desc: "Processes the discovery follows.", Series: []Series{s("processes_tracked")}},
	{Name: "slowrank.agent.processes.added", Kind: Counter, Unit: "{process}", Component: Agent,
		Desc: "Processes found by the discovery.", Series: []Series{s("processes_added")}},
	{Name: "slowrank.agent.processes.exited", Kind: Counter, Unit: "{process}", Component: Agent,
		Desc: "Followed processes that exited.", Series: []Series{s("processes_exited")}},
	{Name: "slowrank.agent.processes.without_rank", Kind: Counter, Unit: "{process}", Component: Agent,
		Desc: "Matched processes without a rank in their environment.", Series: []Series{s("processes_without_rank")}},
	{Name: "slowrank.agent.processes.rank_workers", Kind: Counter, Unit: "{process}", Component: Agent,
		Desc: "Processes started by a rank with its identity (compile, data-loader workers): not ranks.", Series: []Series{s("processes_rank_workers")}},
	{Name: "slowrank.agent.discovery.refused", Kind: Counter, Unit: "{process}", Component: Agent,
		Desc: "Processes the discovery could not or would not read, by reason.", Series: []Series{
			s("discovery_denied", "reason", "denied"),
			s("discovery_oversized", "reason", "oversized"),
			s("discovery_refused_policy", "reason", "policy"),
			s("discovery_refused_quota", "reason", "quota"),
		}},
	{Name: "slowrank.agent.discovery.deferred", Kind: Counter, Unit: "{event}", Component: Agent,
		Desc: "Process events deferred to the next discovery scan.", Series: []Series{s("discovery_events_deferred")}},
	{Name: "slowrank.agent.libraries", Kind: Gauge, Unit: "{library}", Component: Agent,
		Desc: "Libraries with attached uprobes.", Series: []Series{s("libraries")}},
	{Name: "slowrank.agent.libraries.attached", Kind: Counter, Unit: "{library}", Component: Agent,
		Desc: "Library attachments made.", Series: []Series{s("libraries_attached")}},
	{Name: "slowrank.agent.libraries.detached", Kind: Counter, Unit: "{library}", Component: Agent,
		Desc: "Library attachments closed.", Series: []Series{s("libraries_detached")}},
	{Name: "slowrank.agent.probes.attached", Kind: Counter, Unit: "{probe}", Component: Agent,
		Desc: "Uprobes attached.", Series: []Series{s("probes_attached")}},
	{Name: "slowrank.agent.attachments.reused", Kind: Counter, Unit: "{attachment}", Component: Agent,
		Desc: "Attachments shared by another process mapping the same library.", Series: []Series{s("attachments_reused")}},
	{Name: "slowrank.agent.attach.retries", Kind: Counter, Unit: "{attachment}", Component: Agent,
		Desc: "Attachments retried.", Series: []Series{s("attach_retries")}},
	{Name: "slowrank.agent.symbols.missing", Kind: Counter, Unit: "{symbol}", Component: Agent,
		Desc: "Probed symbols a library lacks.", Series: []Series{s("symbols_missing")}},
	{Name: "slowrank.agent.track.errors", Kind: Counter, Unit: "{error}", Component: Agent,
		Desc: "Failures to start or stop tracking a process in BPF, by operation.", Series: []Series{
			s("track_errors", "op", "track"),
			s("untrack_errors", "op", "untrack"),
		}},
	{Name: "slowrank.agent.comm_init.failed", Kind: Counter, Unit: "{call}", Component: Agent,
		Desc: "NCCL communicator inits that returned an error.", Series: []Series{s("comm_init_failed")}},
	{Name: "slowrank.agent.torch.ignored", Kind: Counter, Unit: "{event}", Component: Agent,
		Desc: "torch c10d events not used as intervals, by kind.", Series: []Series{
			s("torch_future_waits_ignored", "kind", "future_wait"),
			s("torch_collectives_redundant", "kind", "redundant_collective"),
		}},
	{Name: "slowrank.agent.nccl.plugin.ignored", Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "NCCL profiler-plugin records ignored because --nccl-plugin is off (the libnccl uprobes report those calls).", Series: []Series{s("nccl_plugin_records_ignored")}},
	{Name: "slowrank.agent.nccl.plugin.processes", Kind: Counter, Unit: "{process}", Component: Agent,
		Desc: "Processes whose NCCL collectives switched from the uprobes to the profiler plugin.", Series: []Series{s("nccl_plugin_processes")}},
	{Name: "slowrank.agent.nccl.plugin.kept_on_uprobes", Kind: Counter, Unit: "{process}", Component: Agent,
		Desc: "Processes kept on (or returned to) the libnccl uprobes with --nccl-plugin: they make ncclAlltoAll, ncclGather or ncclScatter, which the plugin of NCCL 2.28+ reports only as per-peer sends and receives.", Series: []Series{s("nccl_processes_kept_on_uprobes")}},
	{Name: "slowrank.agent.nccl.plugin.withheld", Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "NCCL profiler-plugin collective records not fed because their process is kept on the uprobes (the uprobes report those calls).", Series: []Series{s("nccl_plugin_records_kept_on_uprobes")}},
	{Name: "slowrank.agent.nccl.plugin.collectives", Kind: Counter, Unit: "{call}", Component: Agent,
		Desc: "NCCL collectives taken from the profiler plugin's records.", Series: []Series{s("nccl_plugin_colls")}},
	{Name: "slowrank.agent.nccl.kernel_channels.off", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "1 while the NCCL plugin's kernel-channel events are kept off: measured too dear in on-phases (an NCCL profiler regression; the agent log and status say by how much) or --nccl-kernel-channels off. No device arrival order then.", Series: []Series{s("nccl_kernel_channels_off")}},
	{Name: "slowrank.agent.nccl.plugin.kernels", Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "NCCL profiler-plugin kernel records (a collective's GPU start and end) fed to the correlator for the device arrival order; slowrank.correlate.kernels.joined counts those it joined with their calls.", Series: []Series{s("nccl_kernel_records")}},
	{Name: "slowrank.agent.nccl.plugin.comms", Kind: Counter, Unit: "{communicator}", Component: Agent,
		Desc: "Communicators taken from the profiler plugin's records, by outcome.", Series: []Series{
			s("nccl_plugin_comms", "outcome", "tracked"),
			s("nccl_plugin_comms_refused", "outcome", "refused_bound"),
			s("nccl_plugin_comms_mapped", "outcome", "mapped_to_uprobe_comm"),      // its calls take the uprobes' ncclComm_t handle
			s("nccl_plugin_comms_mapped_by_init", "outcome", "mapped_by_creation"), // the ncclComm_t of the uprobes' comm init holding its init
			s("nccl_plugin_comms_unmapped", "outcome", "unmapped"),                 // neither: a handle of its own
		}},
	{Name: "slowrank.agent.nccl.plugin.tids_unmapped", Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "NCCL profiler-plugin records of a process in its own PID namespace whose thread id could not be turned into the host's (the thread was gone): they keep the namespace's id, match no uprobe call, and may be counted twice at a capture-path switch.", Series: []Series{s("nccl_plugin_tids_unmapped")}},
	{Name: "slowrank.agent.nccl.collective_uprobes.changes", Kind: Counter, Unit: "{library}", Component: Agent,
		Desc: "Changes of a libnccl file's collective uprobes: closed once every process mapping it is on the profiler-plugin path, made again when one is not, by outcome.", Series: []Series{
			s("nccl_collective_probes_detached", "change", "detached"),
			s("nccl_collective_probes_reattached", "change", "reattached"),
			s("nccl_collective_detach_errors", "change", "detach_failed"),
			s("nccl_collective_reattach_errors", "change", "reattach_failed"),
		}},
	{Name: "slowrank.agent.nccl.collective_uprobes.blind", Kind: Counter, Unit: "ms", Component: Agent,
		Desc: "Time a process that needs a libnccl file's closed collective uprobes waited for them to be made again: its collectives in that time were not seen.", Series: []Series{s("nccl_collective_blind_ms")}},
	{Name: "slowrank.agent.nccl.collective_uprobes.blind_waits", Kind: Counter, Unit: "{wait}", Component: Agent,
		Desc: "Such waits (one per re-attach that a process waited for).", Series: []Series{s("nccl_collective_blind_waits")}},
	{Name: "slowrank.agent.nvml.samples", Kind: Counter, Unit: "{sample}", Component: Agent,
		Desc: "NVML samples taken for GPU evidence.", Series: []Series{s("nvml_samples")}},
	{Name: "slowrank.agent.nvml.errors", Kind: Counter, Unit: "{error}", Component: Agent,
		Desc: "NVML calls that failed.", Series: []Series{s("nvml_errors")}},

	// Device records (the injection library's batches, as the agent reads them).
	{Name: "slowrank.device.batches", Kind: Counter, Unit: "{batch}", Component: Agent,
		Desc: "Batches of device records read.", Series: []Series{s("batches")}},
	{Name: "slowrank.device.batches.dropped", Kind: Counter, Unit: "{batch}", Component: Agent,
		Desc: "Batches of device records lost or refused, by reason.", Series: []Series{
			s("batches_lost", "reason", "sequence_gap"),
			s("batches_malformed", "reason", "malformed"),
			s("batches_implausible", "reason", "implausible"),
		}},
	{Name: "slowrank.device.records", Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "Device records (kernels, copies) read.", Series: []Series{s("device_records")}},

	// CUPTI coexistence, as the agent's uprobes see it.
	{Name: "slowrank.agent.cupti.calls", Kind: Counter, Unit: "{call}", Component: Agent,
		Desc: "CUPTI entry points called, by client (own: the injection library).", Series: []Series{
			s("cupti_own_calls", "client", "own"),
			s("cupti_foreign_calls", "client", "foreign"),
		}},
	{Name: "slowrank.agent.cupti.decisions", Kind: Counter, Unit: "{decision}", Component: Agent,
		Desc: "Yield decisions written to the library's control block.", Series: []Series{s("cupti_decisions")}},
	{Name: "slowrank.agent.cupti.yields", Kind: Counter, Unit: "{decision}", Component: Agent,
		Desc: "Decisions to yield device collection to another CUPTI client.", Series: []Series{s("cupti_yields")}},
	{Name: "slowrank.agent.cupti.resumes", Kind: Counter, Unit: "{decision}", Component: Agent,
		Desc: "Decisions to resume device collection after another client's session.", Series: []Series{s("cupti_resumes")}},
	{Name: "slowrank.agent.cupti.handback.writes", Kind: Counter, Unit: "{write}", Component: Agent,
		Desc: "Another client's callbacks published to the library.", Series: []Series{s("cupti_handback_writes")}},
	{Name: "slowrank.agent.cupti.errors", Kind: Counter, Unit: "{error}", Component: Agent,
		Desc: "Failed writes of the control or hand-back block, by block.", Series: []Series{
			s("cupti_control_errors", "block", "control"),
			s("cupti_handback_errors", "block", "handback"),
		}},
	{Name: "slowrank.agent.process_memory.refused", Kind: Counter, Unit: "{event}", Component: Agent,
		Desc: "Reads and writes of a training process's memory not made, by reason: image_gone (the process exec'ed or exited: its descriptor, opened when it was found, reaches nothing; once per image), image_changed (the process exec'ed between discovery's reading of its environment and the open of its memory: the descriptor is closed unused; once per process found), block (the address holds no library block, or one whose agent-written generation moved; each time).", Series: []Series{
			s("proc_mem_image_gone", "reason", "image_gone"),
			s("proc_mem_image_changed", "reason", "image_changed"),
			s("proc_mem_block_refused", "reason", "block"),
		}},

	// The injection library's own statistics (cupti.Stat), summed over processes.
	{Name: "slowrank.cupti.records.seen", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "CUPTI records the library walked.", Series: []Series{s("cupti_lib_records_seen")}},
	{Name: "slowrank.cupti.records.emitted", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "Records the library emitted, by kind.", Series: []Series{
			s("cupti_lib_kernels", "kind", "kernel"),
			s("cupti_lib_memcpys", "kind", "memcpy"),
			s("cupti_lib_memsets", "kind", "memset"),
		}},
	{Name: "slowrank.cupti.records.unconverted", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "CUPTI records of kinds the library does not convert.", Series: []Series{s("cupti_lib_unknown_kinds")}},
	{Name: "slowrank.cupti.records.dropped", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "Records the library dropped, by reason (bad_record: truncated, or ending before they start; incomplete: without timestamps, returned by a forced flush before their work ran; foreign_clock: on another client's clock that could not be mapped).", Series: []Series{
			s("cupti_lib_bad_records", "reason", "bad_record"),
			s("cupti_lib_incomplete_records", "reason", "incomplete"),
			s("cupti_lib_foreign_clock", "reason", "foreign_clock"),
		}},
	{Name: "slowrank.cupti.records.detached", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "Records completed while no agent was attached (not collected by design).", Series: []Series{s("cupti_lib_discarded_detached")}},
	{Name: "slowrank.cupti.records.clock_converted", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "Records on another clock (CLOCK_REALTIME, TSC) mapped to CLOCK_MONOTONIC.", Series: []Series{s("cupti_lib_clock_converted")}},
	{Name: "slowrank.cupti.names", Kind: Counter, Unit: "{name}", Component: Library,
		Desc: "Distinct kernel names interned by the library.", Series: []Series{s("cupti_lib_names")}},
	{Name: "slowrank.cupti.names.overflow", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "Kernels whose name did not fit the library's table.", Series: []Series{s("cupti_lib_names_overflow")}},
	{Name: "slowrank.cupti.buffers", Kind: Counter, Unit: "{buffer}", Component: Library,
		Desc: "Activity buffers CUPTI asked for and handed back, by event.", Series: []Series{
			s("cupti_lib_buffers_requested", "event", "requested"),
			s("cupti_lib_buffers_completed", "event", "completed"),
		}},
	{Name: "slowrank.cupti.buffers.refused", Kind: Counter, Unit: "{buffer}", Component: Library,
		Desc: "Buffer requests refused with the pool exhausted: CUPTI drops their records.", Series: []Series{s("cupti_lib_buffers_refused")}},
	{Name: "slowrank.cupti.buffers.orphaned", Kind: Counter, Unit: "{buffer}", Component: Library,
		Desc: "Buffers CUPTI never handed back (another client took them).", Series: []Series{s("cupti_lib_buffers_orphaned")}},
	{Name: "slowrank.cupti.buffers.forwarded", Kind: Counter, Unit: "{buffer}", Component: Library,
		Desc: "Another client's buffers completed to the library, passed to that client's callback.", Series: []Series{s("cupti_lib_forwarded")}},
	{Name: "slowrank.cupti.batches", Kind: Counter, Unit: "{batch}", Component: Library,
		Desc: "Batches the library emitted.", Series: []Series{s("cupti_lib_batches")}},
	{Name: "slowrank.cupti.batches.size", Kind: Counter, Unit: "By", Component: Library,
		Desc: "Bytes of the batches the library emitted.", Series: []Series{s("cupti_lib_batch_bytes")}},
	{Name: "slowrank.cupti.flushes", Kind: Counter, Unit: "{call}", Component: Library,
		Desc: "cuptiActivityFlushAll calls.", Series: []Series{s("cupti_lib_flushes")}},
	{Name: "slowrank.cupti.enables", Kind: Counter, Unit: "{transition}", Component: Library,
		Desc: "Device collection switched from off to on.", Series: []Series{s("cupti_lib_enables")}},
	{Name: "slowrank.cupti.reenabled", Kind: Counter, Unit: "{transition}", Component: Library,
		Desc: "Kinds enabled again after a toggle raced another client.", Series: []Series{s("cupti_lib_reenabled")}},
	{Name: "slowrank.cupti.attaches", Kind: Counter, Unit: "{attach}", Component: Library,
		Desc: "Agent attachments the library saw (semaphore 0 to non-zero).", Series: []Series{s("cupti_lib_attaches")}},
	{Name: "slowrank.cupti.setups", Kind: Counter, Unit: "{call}", Component: Library,
		Desc: "Callback (re)registrations.", Series: []Series{s("cupti_lib_setups")}},
	{Name: "slowrank.cupti.errors", Kind: Counter, Unit: "{call}", Component: Library,
		Desc: "CUPTI calls of the library that failed.", Series: []Series{s("cupti_lib_cupti_errors")}},
	{Name: "slowrank.cupti.collection.time", Kind: Counter, Unit: "s", Component: Library,
		Desc: "Time with device collection enabled.", Series: []Series{{Key: "cupti_lib_on_ns", Scale: 1e-9}}},
	{Name: "slowrank.cupti.yields", Kind: Counter, Unit: "{yield}", Component: Library,
		Desc: "Times the library yielded CUPTI to another client (a profiler).", Series: []Series{s("cupti_lib_yields")}},
	{Name: "slowrank.cupti.yielded.time", Kind: Counter, Unit: "s", Component: Library,
		Desc: "Time yielded to another CUPTI client.", Series: []Series{{Key: "cupti_lib_yielded_ns", Scale: 1e-9}}},
	{Name: "slowrank.cupti.lease.expired", Kind: Counter, Unit: "{event}", Component: Library,
		Desc: "Configurations that outlived their lease (the agent stopped rewriting them): collection off.", Series: []Series{s("cupti_lib_lease_expired")}},
	{Name: "slowrank.cupti.config.refused", Kind: Counter, Unit: "{config}", Component: Library,
		Desc: "Configurations the library refused as out of bounds.", Series: []Series{s("cupti_lib_control_rejected")}},
	{Name: "slowrank.cupti.handbacks", Kind: Counter, Unit: "{handback}", Component: Library,
		Desc: "Another client's buffer callbacks registered again after the library's, by outcome.", Series: []Series{
			s("cupti_lib_handbacks", "outcome", "registered"),
			s("cupti_lib_handback_rejected", "outcome", "rejected"),
		}},
	{Name: "slowrank.cupti.callbacks.taken", Kind: Counter, Unit: "{yield}", Component: Library,
		Desc: "Yields where the library may have replaced another client's callbacks and none were given back.", Series: []Series{s("cupti_lib_callbacks_taken")}},

	// The library as NCCL's profiler plugin (cupti/slowrank_nccl.c).
	{Name: "slowrank.cupti.nccl.events", Kind: Counter, Unit: "{call}", Component: Library,
		Desc: "startEvent calls NCCL made into the plugin, by outcome.", Series: []Series{
			s("cupti_lib_nccl_events", "outcome", "seen"),
			s("cupti_lib_nccl_unknown_events", "outcome", "unknown_type"),
			s("cupti_lib_nccl_bad_handles", "outcome", "bad_handle"),
		}},
	{Name: "slowrank.cupti.nccl.records", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "Records the plugin queued, by kind.", Series: []Series{
			s("cupti_lib_nccl_colls", "kind", "collective"),
			s("cupti_lib_nccl_kernels", "kind", "kernel"),
		}},
	{Name: "slowrank.cupti.nccl.discarded", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "Plugin records drained while no agent was attached (not collected by design).", Series: []Series{s("cupti_lib_nccl_discarded")}},
	{Name: "slowrank.cupti.nccl.api_lost", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "Collectives recorded without their API call's times (its slot was reused first).", Series: []Series{s("cupti_lib_nccl_api_lost")}},
	{Name: "slowrank.cupti.nccl.comms", Kind: Counter, Unit: "{communicator}", Component: Library,
		Desc: "Communicators the plugin saw initialised, by outcome.", Series: []Series{
			s("cupti_lib_nccl_comms", "outcome", "tracked"),
			s("cupti_lib_nccl_comm_overflow", "outcome", "untracked"),
		}},
	{Name: "slowrank.cupti.nccl.clock", Kind: Counter, Unit: "{record}", Component: Library,
		Desc: "Kernel records whose GPU end lay after the host saw it: clamped within the slack, flagged beyond.", Series: []Series{
			s("cupti_lib_nccl_clock_clamped", "outcome", "clamped"),
			s("cupti_lib_nccl_clock_suspect", "outcome", "suspect"),
		}},

	// Correlator (agent/ → correlate/).
	{Name: "slowrank.correlate.records.unassigned", Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "Records that fell into no step.", Series: []Series{s("correlate_unassigned")}},
	{Name: "slowrank.correlate.records.reordered", Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "Records placed after reordering.", Series: []Series{s("correlate_reordered")}},
	{Name: "slowrank.correlate.steps", Kind: Counter, Unit: "{step}", Component: Agent,
		Desc: "Steps that are not plain facts, by outcome (invalid: dropped; degraded: without device records; without_rank; retracted: tentative steps withdrawn; burst: boundaries far shorter than the steps, merged into the next or dropped).", Series: []Series{
			s("correlate_invalid_steps", "outcome", "invalid"),
			s("correlate_degraded_steps", "outcome", "degraded"),
			s("correlate_norank_steps", "outcome", "without_rank"),
			s("correlate_retracted_steps", "outcome", "retracted"),
			s("correlate_burst_steps", "outcome", "burst"),
		}},
	{Name: "slowrank.correlate.calls", Kind: Counter, Unit: "{call}", Component: Agent,
		Desc: "Collective calls cut into no step, by kind (irregular: outside a locked cycle; init: before a communicator's first cycle).", Series: []Series{
			s("correlate_irregular_calls", "kind", "irregular"),
			s("correlate_init_calls", "kind", "init"),
		}},
	{Name: "slowrank.correlate.relocks", Kind: Counter, Unit: "{event}", Component: Agent,
		Desc: "Step cycles locked again after being lost.", Series: []Series{s("correlate_relocks")}},
	{Name: "slowrank.correlate.arrival.timeouts", Kind: Counter, Unit: "{step}", Component: Agent,
		Desc: "Steps emitted before every local peer reported its arrival.", Series: []Series{s("correlate_arrival_timeouts")}},
	{Name: "slowrank.correlate.arrival.misaligned", Kind: Counter, Unit: "{call}", Component: Agent,
		Desc: "Collective calls that NCCL names differently from a local peer's call of the same ordinal (one rank's capture saw a call its peers' did not), by outcome: realigned (the rank's calls take the peer's ordinals from then on) or not compared (the row is left out).", Series: []Series{
			s("correlate_arrival_realigned", "outcome", "realigned"),
			s("correlate_arrival_misaligned", "outcome", "not_compared"),
		}},
	{Name: "slowrank.correlate.kernels.received", Kind: Counter, Unit: "{record}", Component: Agent,
		Desc: "NCCL collective kernel records the correlator received (joined unless counted in slowrank.records.dropped, reason nccl_kernel_unmatched).", Series: []Series{s("correlate_kernel_records")}},
	{Name: "slowrank.correlate.device_arrival.timeouts", Kind: Counter, Unit: "{step}", Component: Agent,
		Desc: "Steps emitted before every collecting local peer's kernel records of their collectives came (3 s after the step's end).", Series: []Series{s("correlate_device_arrival_timeouts")}},
	{Name: "slowrank.correlate.implausible_sizes", Kind: Counter, Unit: "{report}", Component: Agent,
		Desc: "World or communicator sizes above 131,072 ranks (from a process's environment or its NCCL calls), treated as unknown.", Series: []Series{s("correlate_implausible_sizes")}},

	// Detector and pipeline.
	{Name: "slowrank.agent.windows", Kind: Counter, Unit: "{window}", Component: Agent,
		Desc: "Detector windows settled.", Series: []Series{s("windows")}},
	{Name: "slowrank.agent.facts", Kind: Counter, Unit: "{fact}", Component: Agent,
		Desc: "Step facts produced.", Series: []Series{s("facts")}},
	{Name: "slowrank.agent.verdicts", Kind: Counter, Unit: "{verdict}", Component: Agent,
		Desc: "Verdicts produced (slowrank.verdicts has them by state).", Series: []Series{s("verdicts")}},
	{Name: "slowrank.agent.alerts", Kind: Gauge, Unit: "{alert}", Component: Agent,
		Desc: "Active straggler alerts.", Series: []Series{s("alerts")}},
	{Name: "slowrank.detector.evicted", Kind: Counter, Unit: "{rank}", Component: Agent,
		Desc: "Per-rank detector state evicted (ranks that disappeared, or beyond bounds).", Series: []Series{s("detector_evicted")}},
	{Name: "slowrank.detector.ranks.rejected", Kind: Counter, Unit: "{rank}", Component: Agent,
		Desc: "Ranks the detector refused (beyond its bounds).", Series: []Series{s("detector_rejected_ranks")}},
	{Name: "slowrank.detector.steps.rejected", Kind: Counter, Unit: "{step}", Component: Agent,
		Desc: "Step facts the detector rejected.", Series: []Series{s("steps_rejected")}},
	{Name: "slowrank.detector.topologies.rejected", Kind: Counter, Unit: "{topology}", Component: Agent,
		Desc: "Topology facts the detector rejected.", Series: []Series{s("topologies_rejected")}},
	{Name: "slowrank.detector.topology.versions", Kind: Counter, Unit: "{topology}", Component: Agent,
		Desc: "Topology versions handed to the detector.", Series: []Series{s("topology_versions")}},
	{Name: "slowrank.agent.detector.swaps", Kind: Counter, Unit: "{change}", Component: Agent,
		Desc: "Detector changes at run time.", Series: []Series{s("detector_swaps")}},
	{Name: "slowrank.agent.detector.window", Kind: Gauge, Unit: "s", Component: Agent,
		Desc: "Detector window.", Series: []Series{s("detector_window_seconds")}},
	{Name: "slowrank.agent.detector.threshold", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "Relative deviation that makes a window slow (phase: a per-phase override).", Series: []Series{
			s("detector_threshold"),
			{Key: "detector_phase_threshold_*", Suffix: "phase"},
		}},
	{Name: "slowrank.agent.detector.floor", Kind: Gauge, Unit: "s", Component: Agent,
		Desc: "Absolute difference below which no window is slow.", Series: []Series{s("detector_floor_seconds")}},
	{Name: "slowrank.agent.detector.consecutive", Kind: Gauge, Unit: "{window}", Component: Agent,
		Desc: "Slow windows before an alert.", Series: []Series{s("detector_consecutive")}},
	{Name: "slowrank.agent.names.interned", Kind: Gauge, Unit: "{name}", Component: Agent,
		Desc: "Kernel and symbol names interned by the agent.", Series: []Series{s("names_interned")}},
	{Name: "slowrank.agent.names.refused", Kind: Counter, Unit: "{name}", Component: Agent,
		Desc: "Names refused (table full or too long): their records carry no name.", Series: []Series{s("names_refused")}},
	{Name: "slowrank.agent.names.missing", Kind: Counter, Unit: "{name}", Component: Agent,
		Desc: "Name lookups of ids never interned.", Series: []Series{s("names_missing")}},

	// Control, duty cycle and overhead.
	{Name: "slowrank.agent.uptime", Kind: Gauge, Unit: "s", Component: Agent,
		Desc: "Time since the agent started (its heartbeat: the alert rules watch it change).", Series: []Series{s("uptime_seconds")}},
	{Name: "slowrank.agent.paused", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "1 while collection is paused.", Series: []Series{s("paused")}},
	{Name: "slowrank.agent.control.actions", Kind: Counter, Unit: "{action}", Component: Agent,
		Desc: "Runtime control actions, by action.", Series: []Series{
			s("control_pauses", "action", "pause"),
			s("control_resumes", "action", "resume"),
		}},
	{Name: "slowrank.agent.status_socket.waiting", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "1 while the agent runs without its status socket: another listener holds it (an agent running, or one still exiting), and the agent tries it again every second.", Series: []Series{s("status_socket_waiting")}},
	{Name: "slowrank.agent.status_socket.attempts", Kind: Counter, Unit: "{attempt}", Component: Agent,
		Desc: "Attempts to listen on the status socket that found it unavailable (held by another listener, or not creatable).", Series: []Series{s("status_socket_retries")}},
	{Name: "slowrank.agent.status_socket.changes", Kind: Counter, Unit: "{socket}", Component: Agent,
		Desc: "Status sockets taken or lost, by event (takeover: a stale socket left by a dead agent replaced; lost: the agent's socket found removed or replaced, then made again).", Series: []Series{
			s("status_socket_takeovers", "event", "takeover"),
			s("status_socket_lost", "event", "lost"),
		}},
	{Name: "slowrank.agent.device.collection", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "Device collection state: 1 for the current one (off, no-lib, duty, escalated, paused).", Series: []Series{{Key: "device_collection_*", Suffix: "state"}}},
	{Name: "slowrank.agent.duty.share", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "On-share of device collection.", Series: []Series{s("duty_share")}},
	{Name: "slowrank.agent.duty.budget", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "Overhead budget of device collection (fraction of step time).", Series: []Series{s("duty_budget")}},
	{Name: "slowrank.agent.duty.cost", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "Cost of full device collection (fraction of step time): the estimate and its 95 % interval (high: what the ledger charges).", Series: []Series{
			s("duty_cost_estimate", "bound", "estimate"),
			s("duty_cost_low", "bound", "low"),
			s("duty_cost_high", "bound", "high"),
		}},
	{Name: "slowrank.agent.duty.cost.pairs", Kind: Gauge, Unit: "{pair}", Component: Agent,
		Desc: "Paired on/off blocks behind the cost estimate.", Series: []Series{s("duty_cost_pairs")}},
	{Name: "slowrank.agent.duty.cost.measured", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "1 once the cost estimate is measured in this run (else the prior).", Series: []Series{s("duty_cost_measured")}},
	{Name: "slowrank.agent.duty.pairs.dropped", Kind: Counter, Unit: "{pair}", Component: Agent,
		Desc: "On/off pairs left out of the cost estimate, by reason.", Series: []Series{
			s("duty_pairs_dropped_short", "reason", "short"),
			s("duty_pairs_dropped_drift", "reason", "drift"),
			s("duty_pairs_dropped_suspect", "reason", "suspect"),
		}},
	{Name: "slowrank.agent.duty.escalations", Kind: Counter, Unit: "{escalation}", Component: Agent,
		Desc: "Escalations to full device collection, by outcome (refused: the ledger could not pay for them).", Series: []Series{
			s("duty_escalations_granted", "outcome", "granted"),
			s("duty_escalations_refused", "outcome", "refused"),
		}},
	{Name: "slowrank.agent.duty.writes", Kind: Counter, Unit: "{write}", Component: Agent,
		Desc: "Duty-cycle configurations written to the library.", Series: []Series{s("duty_writes")}},
	{Name: "slowrank.agent.duty.write.errors", Kind: Counter, Unit: "{write}", Component: Agent,
		Desc: "Duty-cycle configurations that could not be written.", Series: []Series{s("duty_write_errors")}},
	{Name: "slowrank.agent.duty.changes", Kind: Counter, Unit: "{change}", Component: Agent,
		Desc: "Duty-cycle settings changed at run time.", Series: []Series{s("duty_changes")}},
	{Name: "slowrank.agent.overhead.budget", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "Overhead budget of everything the agent adds (fraction of step time).", Series: []Series{s("overhead_budget")}},
	{Name: "slowrank.agent.overhead.spent", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "Overhead spent over the ledger's horizon, by source: device, uprobes, nccl_plugin (operations the NCCL profiler plugin recorded), library, and total (fraction of training time).", Series: []Series{{Key: "overhead_spent_*", Suffix: "source"}}},
	{Name: "slowrank.agent.overhead.uprobes.hidden", Kind: Gauge, Unit: "1", Component: Agent,
		Desc: "Uprobe trap time not charged to the budget because the host waited for the device for longer in the same steps (fraction of training time).", Series: []Series{s("overhead_hidden_uprobes")}},

	// The agent's Go runtime and limits.
	{Name: "slowrank.agent.go.goroutines", Kind: Gauge, Unit: "{goroutine}", Component: Agent,
		Desc: "Goroutines of the agent.", Series: []Series{s("goroutines")}},
	{Name: "slowrank.agent.go.heap.inuse", Kind: Gauge, Unit: "By", Component: Agent,
		Desc: "Bytes in in-use heap spans.", Series: []Series{s("heap_inuse_bytes")}},
	{Name: "slowrank.agent.go.heap.live", Kind: Gauge, Unit: "By", Component: Agent,
		Desc: "Heap bytes live after the last GC.", Series: []Series{s("heap_live_bytes")}},
	{Name: "slowrank.agent.go.sys", Kind: Gauge, Unit: "By", Component: Agent,
		Desc: "Bytes the Go runtime obtained from the system.", Series: []Series{s("go_sys_bytes")}},
	{Name: "slowrank.agent.go.gc.cycles", Kind: Counter, Unit: "{cycle}", Component: Agent,
		Desc: "Completed GC cycles.", Series: []Series{s("gc_cycles")}},
	{Name: "slowrank.agent.memory.limit", Kind: Gauge, Unit: "By", Component: Agent,
		Desc: "The agent's memory limit.", Series: []Series{s("memory_limit_bytes")}},
	{Name: "slowrank.agent.memory.over_bound", Kind: Counter, Unit: "{check}", Component: Agent,
		Desc: "Checks that found the agent's memory over its bound.", Series: []Series{s("memory_over_bound")}},
	{Name: "slowrank.agent.threads", Kind: Gauge, Unit: "{thread}", Component: Agent,
		Desc: "Threads of the agent.", Series: []Series{s("threads")}},
	{Name: "slowrank.agent.memory.rss", Kind: Gauge, Unit: "By", Component: Process,
		Desc: "Resident set size of the slowrank process.", Series: []Series{
			s("process_rss_bytes"),
			{Key: "rss_bytes", Component: Agent}, // the agent's limits check reads the same value
		}},
	{Name: "slowrank.agent.cpu.time", Kind: Counter, Unit: "s", Component: Process,
		Desc: "CPU time (user+system) of the slowrank process.", Series: []Series{s("process_cpu_seconds")}},

	// Outputs: JSONL files, OTLP export, forwarding.
	{Name: "slowrank.jsonl.lines.written", Kind: Counter, Unit: "{line}", Component: Outputs,
		Desc: "JSONL lines written, by file.", Series: []Series{
			s("jsonl_facts_written", "file", "facts"),
			s("jsonl_verdicts_written", "file", "verdicts"),
		}},
	{Name: "slowrank.jsonl.lines.lost", Kind: Counter, Unit: "{line}", Component: Outputs,
		Desc: "JSONL lines that could not be written, by file.", Series: []Series{
			s("jsonl_facts_lost", "file", "facts"),
			s("jsonl_verdicts_lost", "file", "verdicts"),
		}},
	{Name: "slowrank.jsonl.write.failing", Kind: Gauge, Unit: "1", Component: Outputs,
		Desc: "1 while writes to the file fail.", Series: []Series{
			s("jsonl_facts_write_failing", "file", "facts"),
			s("jsonl_verdicts_write_failing", "file", "verdicts"),
		}},
	{Name: ExportDropped, Kind: Counter, Unit: "{item}", Component: Export,
		Desc: "Telemetry the exporter dropped, by signal, reason and unit (span, fact, point).", Series: []Series{
			s("otel_spans_dropped_queue_full", "signal", "traces", "reason", "queue_full", "unit", "span"),
			s("otel_spans_dropped_export_failed", "signal", "traces", "reason", "export_failed", "unit", "span"),
			s("otel_spans_dropped_shutdown", "signal", "traces", "reason", "shutdown", "unit", "span"),
			s("otel_facts_dropped_buffer_overflow", "signal", "traces", "reason", "buffer_overflow", "unit", "fact"),
			s("otel_facts_dropped_settle_queue", "signal", "traces", "reason", "settle_queue", "unit", "fact"),
			s("otel_facts_dropped_window_budget", "signal", "traces", "reason", "window_budget", "unit", "fact"),
			s("otel_facts_dropped_shutdown", "signal", "traces", "reason", "shutdown", "unit", "fact"),
			s("otel_metric_points_failed", "signal", "metrics", "reason", "export_failed", "unit", "point"),
		}},
	{Name: "slowrank.export.spans", Kind: Counter, Unit: "{span}", Component: Export,
		Desc: "Spans exported successfully.", Series: []Series{s("otel_spans_exported")}},
	{Name: "slowrank.export.errors", Kind: Counter, Unit: "{error}", Component: Export,
		Desc: "Errors reported to the OpenTelemetry error handler (export failures).", Series: []Series{s("otel_export_errors")}},
	{Name: "slowrank.export.late_facts", Kind: Counter, Unit: "{fact}", Component: Export,
		Desc: "Step facts that arrived after their window settled (they follow the kept decision).", Series: []Series{s("otel_late_facts")}},
	{Name: "slowrank.export.forced_settles", Kind: Counter, Unit: "{window}", Component: Export,
		Desc: "Windows settled as baseline because newer facts ran ahead (Policy.SettleLag).", Series: []Series{s("otel_forced_settles")}},
	{Name: "slowrank.export.buffered_steps", Kind: Gauge, Unit: "{fact}", Component: Export,
		Desc: "Step facts waiting for their window's verdicts.", Series: []Series{s("otel_buffered_steps")}},
	{Name: "slowrank.forward.records.sent", Kind: Counter, Unit: "{record}", Component: Forward,
		Desc: "Facts the aggregator accepted.", Series: []Series{s("forward_sent")}},
	{Name: "slowrank.forward.requests", Kind: Counter, Unit: "{request}", Component: Forward,
		Desc: "Forwarding requests, by outcome (each retry counts).", Series: []Series{
			s("forward_requests", "outcome", "ok"),
			s("forward_failures", "outcome", "failed"),
		}},
	{Name: "slowrank.forward.records.dropped", Kind: Counter, Unit: "{record}", Component: Forward,
		Desc: "Facts the forwarder dropped, by reason.", Series: []Series{
			s("forward_dropped_queue_full", "reason", "queue_full"),
			s("forward_dropped_stale", "reason", "stale"),
			s("forward_dropped_rejected", "reason", "rejected"),
			s("forward_dropped_shutdown", "reason", "shutdown"),
			s("forward_dropped_topology", "reason", "topology"),
		}},
	{Name: "slowrank.forward.queued", Kind: Gauge, Unit: "{record}", Component: Forward,
		Desc: "Step facts waiting to be forwarded.", Series: []Series{s("forward_queued")}},
	{Name: "slowrank.forward.certificate.reload.failures", Kind: Counter, Unit: "{reload}", Component: Forward,
		Desc: "Renewed client certificates (--aggregator-cert) that failed to load; the previous one is still sent.", Series: []Series{s("forward_cert_reload_failures")}},

	// The aggregator (slowrank aggregate).
	{Name: "slowrank.aggregate.requests", Kind: Counter, Unit: "{request}", Component: Aggregate,
		Desc: "OTLP requests decoded.", Series: []Series{s("aggregate_requests")}},
	{Name: "slowrank.aggregate.requests.refused", Kind: Counter, Unit: "{request}", Component: Aggregate,
		Desc: "Requests refused, by reason (busy: concurrency limit, memory budget or queue full).", Series: []Series{
			s("aggregate_unauthorized", "reason", "unauthorized"),
			s("aggregate_too_large", "reason", "too_large"),
			s("aggregate_bad_requests", "reason", "bad_request"),
			s("aggregate_busy", "reason", "busy"),
			s("aggregate_slow_bodies", "reason", "slow_body"),
		}},
	{Name: "slowrank.aggregate.connections.refused", Kind: Counter, Unit: "{connection}", Component: Aggregate,
		Desc: "Connections closed at once: their source had its maximum of connections, or all were taken and no source held more.", Series: []Series{s("aggregate_refused_conns")}},
	{Name: "slowrank.aggregate.connections.evicted", Kind: Counter, Unit: "{connection}", Component: Aggregate,
		Desc: "Connections closed to make room, all being taken, for a source that held fewer.", Series: []Series{s("aggregate_evicted_conns")}},
	{Name: "slowrank.aggregate.records", Kind: Counter, Unit: "{record}", Component: Aggregate,
		Desc: "Fact records accepted.", Series: []Series{s("aggregate_records")}},
	{Name: "slowrank.aggregate.records.refused", Kind: Counter, Unit: "{record}", Component: Aggregate,
		Desc: "Fact records refused, by reason.", Series: []Series{
			s("aggregate_rejected", "reason", "invalid"),
			s("aggregate_ignored", "reason", "not_slowrank"),
			s("aggregate_impersonation", "reason", "impersonation"),
			s("aggregate_refused_queue", "reason", "queue_full"),
			s("aggregate_refused_queue_client", "reason", "client_queue_share"),
			s("aggregate_refused_hosts", "reason", "hosts_limit"),
			s("aggregate_refused_hosts_client", "reason", "client_hosts_limit"),
			s("aggregate_refused_jobs", "reason", "jobs_limit"),
			s("aggregate_refused_ranks", "reason", "ranks_limit"),
			s("aggregate_refused_ranks_client", "reason", "client_ranks_limit"),
			s("aggregate_refused_topos", "reason", "topology_limit"),
			s("aggregate_invalid", "reason", "detector_rejected"),
		}},
	{Name: "slowrank.aggregate.facts", Kind: Counter, Unit: "{fact}", Component: Aggregate,
		Desc: "Step facts handed to the detector.", Series: []Series{s("aggregate_facts")}},
	{Name: "slowrank.aggregate.topology.versions", Kind: Counter, Unit: "{topology}", Component: Aggregate,
		Desc: "Merged topology versions built.", Series: []Series{s("aggregate_topo_versions")}},
	{Name: "slowrank.aggregate.hosts.forgotten", Kind: Counter, Unit: "{host}", Component: Aggregate,
		Desc: "Hosts forgotten after their time to live.", Series: []Series{s("aggregate_hosts_forgotten")}},
	{Name: "slowrank.aggregate.hosts", Kind: Gauge, Unit: "{host}", Component: Aggregate,
		Desc: "Hosts tracked, by state (silent: nothing for more than a window plus lateness).", Series: []Series{
			s("aggregate_hosts", "state", "tracked"),
			s("aggregate_silent_hosts", "state", "silent"),
		}},
	{Name: "slowrank.aggregate.queued", Kind: Gauge, Unit: "{fact}", Component: Aggregate,
		Desc: "Facts waiting for the detector.", Series: []Series{s("aggregate_queued")}},
	{Name: "slowrank.aggregate.settle.lag", Kind: Gauge, Unit: "s", Component: Aggregate,
		Desc: "How long after its deadline the last settled window reached the sinks.", Series: []Series{{Key: "aggregate_lag_ns", Scale: 1e-9}}},

	// slowrank webhook (agent/admission): every review is admitted; these
	// say what was done to it.
	{Name: "slowrank.webhook.reviews", Kind: Counter, Unit: "{review}", Component: Webhook,
		Desc: "Pod admission reviews answered, by outcome (bad_request: admitted unpatched, with a warning).", Series: []Series{
			s("webhook_patched", "outcome", "patched"),
			s("webhook_not_opted_in", "outcome", "not_opted_in"),
			s("webhook_unchanged", "outcome", "unchanged"),
			s("webhook_not_pod_create", "outcome", "not_pod_create"),
			s("webhook_bad_request", "outcome", "bad_request"),
		}},
	{Name: "slowrank.webhook.values.kept", Kind: Counter, Unit: "{variable}", Component: Webhook,
		Desc: "Variables (CUDA_INJECTION64_PATH, NCCL_PROFILER_PLUGIN) that a container set to another value itself, kept.", Series: []Series{s("webhook_values_kept")}},
	{Name: "slowrank.aggregate.certificate.reload.failures", Kind: Counter, Unit: "{reload}", Component: Aggregate,
		Desc: "Renewed TLS certificates that failed to load; the previous certificate is still served.", Series: []Series{s("aggregate_cert_reload_failures")}},
	{Name: "slowrank.webhook.certificate.reload.failures", Kind: Counter, Unit: "{reload}", Component: Webhook,
		Desc: "Certificate reloads that failed; the previous certificate is still served.", Series: []Series{s("webhook_cert_reload_failures")}},
}

// s is a series of the metric's component.
func s(key string, attrs ...string) Series { return Series{Key: key, Attrs: attrs} }
