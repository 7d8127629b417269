// Fake libtorch_cpu.so: c10d methods with torch's shapes. Collectives return
// a class with a non-trivial destructor (like c10::intrusive_ptr<Work>), so
// the return slot pointer is in rdi and `this` in rsi; Work::wait returns
// bool and c10::ivalue::Future::wait() void, so `this` is in rdi.
#include <chrono>
#include <vector>

namespace c10 {
namespace ivalue {

// What DDP's reducer waits on (bucket.future_work->wait()).
struct Future {
	void wait();
	int waits = 0;
};

} // namespace ivalue
} // namespace c10

namespace c10d {

struct AllreduceOptions {
	int reduceOp;
};
struct BarrierOptions {
	int timeoutMs;
};

class Work {
public:
	virtual ~Work() {}
	bool wait(std::chrono::milliseconds timeout);
	int waits = 0;
};

struct WorkPtr {
	Work *p;
	~WorkPtr();
};

class ProcessGroupGloo {
public:
	WorkPtr allreduce(std::vector<int> &tensors, const AllreduceOptions &opts);
	WorkPtr barrier(const BarrierOptions &opts);
	long calls = 0;
	Work work;
	c10::ivalue::Future future;
};

} // namespace c10d

namespace c10d {

__attribute__((noinline)) bool Work::wait(std::chrono::milliseconds timeout)
{
	waits++;
	return timeout.count() >= 0;
}

__attribute__((noinline)) WorkPtr::~WorkPtr()
{
	__asm__ volatile("" : : "r"(p) : "memory");
}

__attribute__((noinline)) WorkPtr ProcessGroupGloo::allreduce(std::vector<int> &tensors,
							      const AllreduceOptions &opts)
{
	calls += (long)tensors.size() + opts.reduceOp;
	return WorkPtr{&work};
}

__attribute__((noinline)) WorkPtr ProcessGroupGloo::barrier(const BarrierOptions &opts)
{
	calls += opts.timeoutMs;
	return WorkPtr{&work};
}

} // namespace c10d

__attribute__((noinline)) void c10::ivalue::Future::wait()
{
	waits++;
}

extern "C" void *fake_torch_new_pg()
{
	return new c10d::ProcessGroupGloo();
}

extern "C" void fake_torch_allreduce(void *pg)
{
	std::vector<int> t(3);
	c10d::AllreduceOptions o{1};
	c10d::WorkPtr w = static_cast<c10d::ProcessGroupGloo *>(pg)->allreduce(t, o);
	w.p->wait(std::chrono::milliseconds(5));
	static_cast<c10d::ProcessGroupGloo *>(pg)->future.wait();
}

extern "C" void *fake_torch_work(void *pg)
{
	return &static_cast<c10d::ProcessGroupGloo *>(pg)->work;
}

extern "C" void *fake_torch_future(void *pg)
{
	return &static_cast<c10d::ProcessGroupGloo *>(pg)->future;
}
