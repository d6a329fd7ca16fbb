"""What the GPU was and did during a run: name, clocks, power, temperature.

Read through NVML (the `pynvml` module of nvidia-ml-py) when importable, else
through nvidia-smi, else not at all (the JSON then says so). The GPU is found
by the UUID torch reports, so CUDA_VISIBLE_DEVICES cannot mislead it.
"""
import shutil
import subprocess

# nvidia-smi's names for the fields of snapshot(), in order.
SMI_FIELDS = {"name": "name", "driver": "driver_version", "sm_mhz": "clocks.sm", "max_sm_mhz": "clocks.max.sm",
              "power_w": "power.draw", "power_limit_w": "power.limit", "temperature_c": "temperature.gpu",
              "clocks_event_reasons": "clocks_throttle_reasons.active"}


def parse_smi_value(text):
    """A number where nvidia-smi printed one, None for [N/A] and the like, else the text."""
    text = text.strip()
    if text.startswith("["):
        return None
    try:
        return float(text)
    except ValueError:
        return text


class Telemetry:
    def __init__(self, torch):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        uuid = str(props.uuid)
        self.uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid  # NVML's and nvidia-smi's spelling
        self.source, self.nvml, self.handle = self._open_nvml()

    def _open_nvml(self):
        try:
            import pynvml
        except ImportError:
            return self._smi_source("pynvml not importable"), None, None
        try:
            pynvml.nvmlInit()
            return "NVML", pynvml, pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
        except pynvml.NVMLError as e:
            return self._smi_source(f"NVML: {e}"), None, None

    @staticmethod
    def _smi_source(why_not_nvml):
        if shutil.which("nvidia-smi"):
            return f"nvidia-smi ({why_not_nvml})"
        return f"none ({why_not_nvml}, no nvidia-smi)"

    def snapshot(self):
        """Every field of SMI_FIELDS that the source gives."""
        if self.nvml:
            return self._nvml_snapshot()
        if self.source.startswith("nvidia-smi"):
            return self._smi_query(SMI_FIELDS)
        return {}

    def sample(self):
        """The SM clock and the power now: cheap enough to read once per shape."""
        if self.nvml:
            return {"sm_mhz": float(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)),
                    "power_w": self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3}
        if self.source.startswith("nvidia-smi"):
            return self._smi_query({k: SMI_FIELDS[k] for k in ("sm_mhz", "power_w")})
        return {}

    def energy_mj(self):
        """The GPU's energy counter in millijoules (NVML's total since the driver loaded), or None where
        NVML is not there or the GPU has no counter: differences of two readings give joules used."""
        if not self.nvml:
            return None
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except self.nvml.NVMLError:
            return None

    def _nvml_snapshot(self):
        nv, h = self.nvml, self.handle
        # nvidia-ml-py renamed the throttle reasons "clocks event reasons"; older releases have only the old name.
        reasons = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or nv.nvmlDeviceGetCurrentClocksThrottleReasons)
        name = nv.nvmlDeviceGetName(h)
        driver = nv.nvmlSystemGetDriverVersion()
        return {"name": name.decode() if isinstance(name, bytes) else name,
                "driver": driver.decode() if isinstance(driver, bytes) else driver,
                "sm_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                "max_sm_mhz": float(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
                "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1e3,
                "power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
                "temperature_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                "clocks_event_reasons": f"0x{reasons(h):016x}"}

    def _smi_query(self, fields):
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields.values())}", "--format=csv,noheader,nounits",
                              "-i", self.uuid], capture_output=True, text=True, timeout=30)
        values = out.stdout.strip().split(",")
        if out.returncode != 0 or len(values) != len(fields):
            return {"telemetry_error": (out.stderr or out.stdout).strip()[:200]}
        return {k: parse_smi_value(v) for k, v in zip(fields, values)}
