import {
  allocationFractions,
  describeCards,
  describeEnforcement,
  describeIsolation,
  describeSliceSize,
  describeShare,
  formatCompute,
  formatUsedOf,
  statusSummary,
  statusTooltip
} from '../src/format';
import { AllocationReply, UsageReply } from '../src/types';

const allocated: AllocationReply = {
  state: 'allocated',
  source: 'node-api',
  message: null,
  allocation: {
    node: 'gpu-node-a',
    namespace: 'jhub',
    pod: 'jupyter-ada',
    podUid: 'uid-1',
    container: 'notebook',
    cores: 25,
    memoryMib: 4096,
    enforcement: 'hami-core',
    cards: [{ index: 1, uuid: 'GPU-1', model: 'A100-SXM4-80GB', cores: 25, memoryMib: 4096, memoryTotalMib: 81920 }]
  }
};

const live: Pick<UsageReply, 'state' | 'limits' | 'current' | 'message'> = {
  state: 'live',
  message: null,
  limits: { cores: 25, memoryMib: 4096 },
  current: { t: 100, memoryUsedMib: 3174, utilizationPercent: 18.6, cards: [] }
};

describe('status summary', () => {
  it('shows what is used against the share, compute and memory alike', () => {
    // 19 % of the card's compute used of a 25 % share; 3.1 GiB of 4 GiB
    expect(statusSummary(allocated, live)).toBe('vGPU 19/25 % · 3.1/4 GiB');
  });

  it('shows a dash before the first sample and when unreachable', () => {
    expect(statusSummary(allocated, null)).toBe('vGPU –/25 % · –/4 GiB');
    expect(statusSummary(allocated, { state: 'unreachable', limits: null, current: null })).toBe('vGPU –/25 % · –/4 GiB');
  });

  it('names a MIG slice instead of a compute share nobody measures', () => {
    const slice: AllocationReply = {
      ...allocated,
      allocation: {
        ...allocated.allocation!,
        cores: 28,
        memoryMib: 10240,
        enforcement: 'mig',
        cards: [{ index: 0, uuid: 'MIG-1', model: 'A100', cores: 28, memoryMib: 10240, memoryTotalMib: 10240,
                  migProfile: '2g.10gb' }]
      }
    };
    const current = { t: 1, memoryUsedMib: 2048, utilizationPercent: 0, utilizationMeasured: false, cards: [] };
    expect(statusSummary(slice, { state: 'live', limits: { cores: 28, memoryMib: 10240 }, current })).toBe(
      'vGPU MIG 2g.10gb · 2/10 GiB'
    );
  });

  it('names the states without an allocation', () => {
    expect(statusSummary(null, null)).toBe('vGPU …');
    expect(statusSummary({ state: 'none', source: 'none', message: null, allocation: null }, null)).toBe('vGPU: none');
    expect(statusSummary({ state: 'unreachable', source: 'node-api', message: 'timeout', allocation: null }, null)).toBe(
      'vGPU: unreachable'
    );
  });

  it('counts whole cards', () => {
    const whole: AllocationReply = {
      ...allocated,
      allocation: { ...allocated.allocation!, cores: 200, memoryMib: 163840 }
    };
    expect(statusSummary(whole, { state: 'live', limits: { cores: 200, memoryMib: 163840 }, current: null })).toBe(
      'vGPU 2 cards · –/160 GiB'
    );
  });

  it('has a long form for the tooltip', () => {
    expect(statusTooltip(allocated, live)).toBe(
      'vGPU: 25 % of a card with 4 GiB, A100-SXM4-80GB card 1 on gpu-node-a; now 19 % compute, 3.1 GiB memory'
    );
    expect(statusTooltip({ state: 'unreachable', source: 'node-api', message: 'node API: 503', allocation: null }, null)).toBe(
      'node API: 503'
    );
  });
});

describe('enforcement', () => {
  it('names the backend, and says so where nothing but scheduling and the rails hold the share', () => {
    expect(describeEnforcement('hami-core')).toBe('Limits enforced by: hami-core');
    expect(describeEnforcement('none')).toMatch(/^Limits not enforced: the share is kept by scheduling, and the framework guard rails/);
    expect(describeEnforcement('mig')).toMatch(/^Limits enforced by the hardware: a MIG slice/);
  });
});

describe('numbers', () => {
  it('formats used-of in the limit unit', () => {
    expect(formatUsedOf(3174, 4096)).toBe('3.1/4 GiB');
    expect(formatUsedOf(0, 20480)).toBe('0/20 GiB');
    expect(formatUsedOf(300.4, 768)).toBe('300/768 MiB');
    expect(formatUsedOf(null, 1536)).toBe('–/1.5 GiB');
  });

  it('describes shares and cards', () => {
    expect(describeShare(25)).toBe('25 % of a card');
    expect(describeShare(100)).toBe('1 whole card');
    expect(describeShare(300)).toBe('3 whole cards');
    expect(describeCards([1])).toBe('card 1');
    expect(describeCards([0, 3])).toBe('cards 0, 3');
  });

  it('computes the fractions the bars show', () => {
    expect(allocationFractions(allocated.allocation!)).toEqual({ compute: 0.25, memory: 0.05 });
    const whole = {
      ...allocated.allocation!,
      cores: 200,
      memoryMib: 2 * 81920,
      cards: [0, 1].map(index => ({ index, uuid: '', model: 'A100', cores: 100, memoryMib: 81920, memoryTotalMib: 81920 }))
    };
    expect(allocationFractions(whole)).toEqual({ compute: 1, memory: 1 });
  });
});

describe('MIG slices', () => {
  it('names the slice, its card and its isolation', () => {
    const slice = {
      ...allocated.allocation!,
      cores: 28,
      memoryMib: 10240,
      enforcement: 'mig',
      cards: [{ index: 0, uuid: 'MIG-0a1b', model: 'A100-SXM4-40GB', cores: 28, memoryMib: 10240,
                memoryTotalMib: 10240, migProfile: '2g.10gb' }]
    };
    expect(describeIsolation(slice)).toBe('MIG 2g.10gb on GPU 0 (isolated)');
    expect(describeIsolation(allocated.allocation!)).toBeNull();
    // the slice's real size, not the share asked for
    expect(describeSliceSize(slice)).toBe("the whole slice: 28 % of the card's compute, 10 GiB");
    expect(describeSliceSize(allocated.allocation!)).toBeNull();
  });

  it('says "not available" for compute on a slice, never a 0 nobody measured', () => {
    const current = { ...live.current!, utilizationPercent: 0, utilizationMeasured: false };
    expect(formatCompute(current)).toBe('not available');
    expect(formatCompute(live.current!)).toBe('19 %');
    expect(statusTooltip(allocated, { ...live, current })).toBe(
      'vGPU: 25 % of a card with 4 GiB, A100-SXM4-80GB card 1 on gpu-node-a; now 3.1 GiB memory, compute not available'
    );
  });
});
