package detector

import (
	"fmt"
	"math"
	"slices"
)

// Device arrival evidence: who the others waited for on the GPU. A step
// fact says whether the rank's GPU started the step's collectives last
// among its host's ranks (DeviceLastArrival, from the NCCL plugin's
// kernel timestamps on one host clock) and how much GPU time its
// collectives took (DeviceCollMS). A collective ends at about the same
// time on all its ranks, so the rank that reached it last spends the
// least time in it: compared across the cohort that says who was waited
// for on every host, without comparing hosts' clocks. Verdicts carry both
// as evidence next to the phases; neither changes a state.

// deviceCollMargin is how far a rank's collective GPU time must lie from
// its peers' to be read as waited for (below) or waiting (above): a tenth
// of the peers', and at least deviceCollFloorMS.
const (
	deviceCollMargin  = 0.10
	deviceCollFloorMS = 0.05
)

func (rw *rankWindow) recordDevice(s *Step) {
	if s.DeviceLastArrival != nil {
		rw.devArrivals++
		if *s.DeviceLastArrival {
			rw.devLast++
		}
	}
	if s.DeviceCollMS != nil && !math.IsNaN(*s.DeviceCollMS) {
		rw.devColl = append(rw.devColl, *s.DeviceCollMS)
	}
}

// deviceEvidence fills v's device arrival fields from the window of ms[self]
// and its cohort.
func (d *Detector) deviceEvidence(v *Verdict, ms []member, self int) {
	m := ms[self]
	if m.rw != nil && m.rw.devArrivals > 0 {
		share := float64(m.rw.devLast) / float64(m.rw.devArrivals)
		v.DeviceLastArrivalShare = &share
	}
	if math.IsNaN(m.devColl) {
		return
	}
	peers := d.scratchValues[:0]
	for i, o := range ms {
		if i != self && !math.IsNaN(o.devColl) {
			peers = append(peers, o.devColl)
		}
	}
	if len(peers) == 0 {
		return
	}
	slices.Sort(peers)
	peer := peers[len(peers)/2]
	if len(peers)%2 == 0 {
		peer = (peers[len(peers)/2-1] + peer) / 2
	}
	d.scratchValues = peers
	own := m.devColl
	v.DeviceCollMS, v.DeviceCollPeerMS = &own, &peer
}

// deviceText is the device arrival evidence of v for its reason.
func deviceText(v Verdict) string {
	var s string
	if v.DeviceLastArrivalShare != nil {
		s += fmt.Sprintf("; its GPU started the collectives last on its host in %.0f%% of its steps", *v.DeviceLastArrivalShare*100)
	}
	if v.DeviceCollMS == nil {
		return s
	}
	own, peer := *v.DeviceCollMS, *v.DeviceCollPeerMS
	margin := max(deviceCollMargin*peer, deviceCollFloorMS)
	switch {
	case own <= peer-margin:
		s += fmt.Sprintf("; its collectives took %.2f ms on its GPU against its peers' %.2f ms: they waited for it", own, peer)
	case own >= peer+margin:
		s += fmt.Sprintf("; its collectives took %.2f ms on its GPU against its peers' %.2f ms: it waited for them", own, peer)
	}
	return s
}
