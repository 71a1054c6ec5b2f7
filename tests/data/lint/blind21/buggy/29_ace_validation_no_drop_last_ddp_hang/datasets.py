"""Contains code relating to loading (fine, coarse) examples for downscaling."""

import dataclasses
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal, Self, cast

import torch
import torch.utils.data
import xarray as xr
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from fme.core.coordinates import LatLonCoordinates
from fme.core.dataset.concat import XarrayConcat
from fme.core.dataset.data_typing import VariableMetadata
from fme.core.dataset.dataset import DatasetItem
from fme.core.dataset.properties import DatasetProperties
from fme.core.device import get_device, move_tensordict_to_device
from fme.core.generics.data import SizedMap
from fme.core.typing_ import TensorMapping
from fme.downscaling.data.patching import Patch, get_patches
from fme.downscaling.data.time_encoding import compute_calendar_features
from fme.downscaling.data.utils import (
    BatchedLatLonCoordinates,
    ClosedInterval,
    check_leading_dim,
    expand_and_fold_tensor,
    find_roll_anchor_from_interval,
    get_offset,
    paired_shuffle,
    roll_data_along_lon_dim,
    roll_lon_coords,
    scale_tuple,
)


@dataclasses.dataclass
class BatchItem:
    """
    Defines a single downscaling data item with assosciated metadata.  Should
    not contain any leading batch dimensions.

    Note that attached topography is usually normalized for special handling
    inside the downscaling model.
    """

    data: TensorMapping
    time: xr.DataArray
    latlon_coordinates: LatLonCoordinates

    def _validate(self):
        for key, value in self.data.items():
            if value.dim() != 2:
                raise ValueError(
                    f"Expected 2D spatial data, got shape {value.shape} ({key})"
                )
        if self.time.shape != ():
            raise ValueError(f"Expected scalar time, got shape {self.time.shape}")
        if len(self.latlon_coordinates.lat.shape) != 1:
            raise ValueError(
                "Expected 1D lat coordinates, got shape "
                f"{self.latlon_coordinates.lat.shape}"
            )
        if self.latlon_coordinates.lon.dim() != 1:
            raise ValueError(
                "Expected 1D lon coordinates, got shape "
                f"{self.latlon_coordinates.lon.shape}"
            )

    def __post_init__(self):
        self._validate()
        self._horizontal_shape = next(iter(self.data.values())).shape[-2:]

    def __iter__(self):
        return iter([self.data, self.time, self.latlon_coordinates])

    @property
    def horizontal_shape(self) -> tuple[int, int]:
        return self._horizontal_shape

    def to_device(self) -> "BatchItem":
        device_latlon = LatLonCoordinates(
            lat=self.latlon_coordinates.lat.to(get_device()),
            lon=self.latlon_coordinates.lon.to(get_device()),
        )
        return BatchItem(
            move_tensordict_to_device(self.data),
            self.time,
            device_latlon,
        )

    def __eq__(self, value) -> bool:
        for key in self.data.keys():
            if key not in value.data.keys():
                return False
            if not torch.equal(self.data[key], value.data[key]):
                return False
        if not self.time == value.time:
            return False
        if not self.latlon_coordinates == value.latlon_coordinates:
            return False
        return True


class HorizontalSubsetDataset(torch.utils.data.Dataset):
    """Subsets the horizontal latitude-longitude dimensions of a dataset."""

    def __init__(
        self,
        dataset: XarrayConcat,
        properties: DatasetProperties,
        lat_interval: ClosedInterval,
        lon_interval: ClosedInterval,
    ):
        self.dataset = dataset
        self._properties = properties
        self.lat_interval = lat_interval
        self.lon_interval = lon_interval

        if not isinstance(properties.horizontal_coordinates, LatLonCoordinates):
            raise NotImplementedError(
                "Horizontal coordinates must be of type LatLonCoordinates"
            )

        self._orig_coords: LatLonCoordinates = properties.horizontal_coordinates
        lon_start, _ = self.lon_interval.finite_values

        # determine roll amount for each dataset get item operation
        self._lon_roll_amount = find_roll_anchor_from_interval(
            self._orig_coords.lon, self.lon_interval
        )

        # set coordinate metadata for the subsetted region
        rolled_lon = roll_lon_coords(
            self._orig_coords.lon, self._lon_roll_amount, lon_start
        )

        self._lats_slice = self.lat_interval.slice_from(self._orig_coords.lat)
        self._lons_slice = self.lon_interval.slice_from(rolled_lon)
        self._latlon_coordinates = LatLonCoordinates(
            lat=self._orig_coords.lat[self._lats_slice],
            lon=rolled_lon[self._lons_slice],
        )
        self._area_weights = self._latlon_coordinates.area_weights

    @property
    def variable_metadata(self) -> dict[str, VariableMetadata]:
        return self._properties.variable_metadata

    @property
    def vertical_coordinate(self):
        return self._properties.vertical_coordinate

    @property
    def is_remote(self) -> bool:
        return self._properties.is_remote

    @property
    def subset_latlon_coordinates(self) -> LatLonCoordinates:
        return self._latlon_coordinates

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key) -> DatasetItem:
        batch, times, _, epoch, missing_names = self.dataset[key]
        assert (
            missing_names is None
        ), "Variable masking is not supported in downscaling."
        batch = {
            k: roll_data_along_lon_dim(v, self._lon_roll_amount)[
                ...,
                self._lats_slice,
                self._lons_slice,
            ]
            for k, v in batch.items()
        }
        return batch, times, self._properties.all_labels, epoch, None


class BatchItemDatasetAdapter(torch.utils.data.Dataset):
    """
    Adjusts output of dataset to return a BatchItem.
    """

    def __init__(
        self,
        dataset: HorizontalSubsetDataset | XarrayConcat,
        coordinates: LatLonCoordinates,
        properties: DatasetProperties | None = None,
    ):
        self._dataset = dataset
        self._coordinates = coordinates
        self._properties = properties

    def __len__(self):
        return len(self._dataset)

    def __getitem__(self, idx) -> BatchItem:
        fields, time, _, epoch, missing_names = self._dataset[idx]
        assert (
            missing_names is None
        ), "Variable masking is not supported in downscaling."
        fields = {k: v.squeeze() for k, v in fields.items()}
        field_example = next(iter(fields.values()))

        # This is hardcoded by the model DataRequirements to be
        # timestep of 1, which gets squeezed, so not expecting
        # this error to be raised
        if field_example.dim() > 2:
            raise ValueError(
                f"Expected 2D spatial data, got shape {field_example.shape}"
            )

        return BatchItem(fields, time.squeeze(), self._coordinates)

    @property
    def variable_metadata(self) -> dict[str, VariableMetadata]:
        if self._properties is None:
            raise ValueError("Properties not set for this dataset.")
        return self._properties.variable_metadata


@dataclasses.dataclass
class PairedBatchItem:
    """
    Container for pair of fine and coarse batch item.
    Used for convenience to validate and collate items
    into a batch.
    """

    fine: BatchItem
    coarse: BatchItem

    def _validated_scale_factor(self):
        fine = self.fine.horizontal_shape
        coarse = self.coarse.horizontal_shape

        if fine[0] // coarse[0] != fine[1] // coarse[1]:
            raise ValueError(
                "Fine and coarse datasets must have the same scale factor "
                f"between lat and lon dimensions. Got fine {fine} and coarse {coarse}"
            )
        if fine[0] % coarse[0] != 0 or fine[1] % coarse[1] != 0:
            raise ValueError(
                "Fine and coarse horizontal dimensions must be evenly divisible."
                f" Got fine {fine} and coarse {coarse}"
            )

        return fine[0] // coarse[0]

    def _validate(self):
        if not self.fine.time == self.coarse.time:
            raise ValueError("Time must match between fine and coarse items.")
        self.downscale_factor = self._validated_scale_factor()

    def __post_init__(self):
        self._validate()

    def to_device(self) -> "PairedBatchItem":
        return PairedBatchItem(self.fine.to_device(), self.coarse.to_device())

    def __iter__(self):
        return iter([self.fine, self.coarse])


class FineCoarsePairedDataset(torch.utils.data.Dataset):
    """
    A torch dataset that will return a paired fine and coarse batch item.
    from input fine and coarse datasets.
    """

    def __init__(
        self,
        fine: BatchItemDatasetAdapter,
        coarse: BatchItemDatasetAdapter,
    ):
        self.fine = fine
        self.coarse = coarse

        self._validate()

    def _validate(self):
        """Check that datasets are compatible."""
        if not len(self.fine) == len(self.coarse):
            raise ValueError("Datasets must have the same number of items.")

    def __len__(self):
        return len(self.fine)

    def __getitem__(self, idx) -> PairedBatchItem:
        return PairedBatchItem(self.fine[idx], self.coarse[idx])


@dataclasses.dataclass
class GriddedData:
    _loader: torch.utils.data.DataLoader
    shape: tuple[int, int]
    dims: list[str]
    variable_metadata: Mapping[str, VariableMetadata]
    all_times: xr.CFTimeIndex

    @property
    def loader(self) -> DataLoader[BatchItem]:
        def on_device(batch: BatchItem) -> BatchItem:
            return batch.to_device()

        return SizedMap(on_device, self._loader)

    def get_generator(self) -> Iterator["BatchData"]:
        yield from self.loader

    def get_patched_generator(
        self,
        yx_patch_extent: tuple[int, int],
        overlap: int = 0,
        drop_partial_patches: bool = True,
        random_offset: bool = False,
    ) -> Iterator["BatchData"]:
        patched_generator = patched_batch_gen_from_loader(
            loader=self.loader,
            coarse_yx_extent=self.shape,
            coarse_yx_patch_extent=yx_patch_extent,
            coarse_overlap=overlap,
            drop_partial_patches=drop_partial_patches,
            random_offset=random_offset,
        )

        return cast(
            Iterator[BatchData],
            patched_generator,
        )


@dataclasses.dataclass
class PairedGriddedData:
    _loader: torch.utils.data.DataLoader
    coarse_shape: tuple[int, int]
    downscale_factor: int
    dims: list[str]
    variable_metadata: Mapping[str, VariableMetadata]
    all_times: xr.CFTimeIndex
    fine_coords: LatLonCoordinates

    @property
    def loader(self) -> DataLoader[PairedBatchItem]:
        def on_device(batch: PairedBatchItem) -> PairedBatchItem:
            return batch.to_device()

        return SizedMap(on_device, self._loader)

    def get_generator(self) -> Iterator["PairedBatchData"]:
        yield from self.loader

    def get_patched_generator(
        self,
        coarse_yx_patch_extent: tuple[int, int],
        overlap: int = 0,
        drop_partial_patches: bool = True,
        random_offset: bool = False,
        shuffle: bool = False,
        region_sampling: "RegionSamplingConfig | None" = None,
    ) -> Iterator["PairedBatchData"]:
        patched_generator = patched_batch_gen_from_paired_loader(
            self.loader,
            coarse_yx_extent=self.coarse_shape,
            coarse_yx_patch_extent=coarse_yx_patch_extent,
            downscale_factor=self.downscale_factor,
            coarse_overlap=overlap,
            drop_partial_patches=drop_partial_patches,
            random_offset=random_offset,
            shuffle=shuffle,
            region_sampling=region_sampling,
        )
        return cast(
            Iterator[PairedBatchData],
            patched_generator,
        )


@dataclasses.dataclass
class BatchData:
    """
    Downscaling dataset grouping with a leading batch dimension.
    """

    data: TensorMapping
    time: xr.DataArray
    latlon_coordinates: BatchedLatLonCoordinates

    def _validate(self):
        leading_dim = None
        for key, value in self.data.items():
            if leading_dim is None:
                leading_dim = value.shape[:-2]
            else:
                check_leading_dim(f"data {key}", value.shape[:-2], leading_dim)
        if leading_dim is None:
            raise ValueError("Data must have at least one variable")

        check_leading_dim("time", self.time.shape, leading_dim)
        check_leading_dim("lat", self.latlon_coordinates.lat.shape[:-1], leading_dim)
        check_leading_dim("lon", self.latlon_coordinates.lon.shape[:-1], leading_dim)

        # TODO: temporary constraint for only 1 leading batch dimension
        if len(leading_dim) != 1:
            raise NotImplementedError("Only 1 leading batch dimension is supported")

        return leading_dim

    def __post_init__(self):
        leading_dim = self._validate()
        self._len = leading_dim[0]
        self._horizontal_shape = self[0].horizontal_shape
        self.is_patched = False

    @property
    def horizontal_shape(self) -> tuple[int, int]:
        return self._horizontal_shape

    @property
    def lat_interval(self) -> ClosedInterval:
        lat = self.latlon_coordinates.lat[0]  # all batch members identical; use first
        return ClosedInterval(lat.min().item(), lat.max().item())

    @property
    def lon_interval(self) -> ClosedInterval:
        lon = self.latlon_coordinates.lon[0]  # all batch members identical; use first
        return ClosedInterval(lon.min().item(), lon.max().item())

    @classmethod
    def from_sequence(
        cls,
        items: Sequence[BatchItem],
        dim_name: str = "batch",
    ) -> Self:
        data, times, latlon_coordinates = zip(*items)

        return cls(
            torch.utils.data.default_collate(data),
            xr.concat(times, dim_name),
            BatchedLatLonCoordinates.from_sequence(latlon_coordinates),
        )

    def to_device(self) -> "BatchData":
        return BatchData(
            move_tensordict_to_device(self.data),
            self.time,
            self.latlon_coordinates.to_device(),
        )

    def __getitem__(self, k):
        return BatchItem(
            {key: value[k] for key, value in self.data.items()},
            self.time[k],
            self.latlon_coordinates[k],
        )

    def __len__(self):
        return self._len

    def expand_and_fold(self, num_samples, sample_dim, dim_name="sample"):
        """
        Adds a sample dimension to batch data and expands it to the number
        of samples before folding it back into a single leading dimension.
        This is useful for working with aggregregators that expect only 3D
        inputs, but we have generated an ensemble of predictions from a model.
        """
        data = {
            key: expand_and_fold_tensor(value, num_samples, sample_dim)
            for key, value in self.data.items()
        }
        if dim_name in self.time.dims:
            raise ValueError(
                f"Cannot expand time dimension {dim_name} because dim alredy exists"
            )
        time = self.time.expand_dims(dim={dim_name: num_samples}, axis=sample_dim)
        time = time.stack({"repeated_batch": time.dims})
        latlon_coordinates = BatchedLatLonCoordinates(
            lat=expand_and_fold_tensor(
                self.latlon_coordinates.lat, num_samples, sample_dim
            ),
            lon=expand_and_fold_tensor(
                self.latlon_coordinates.lon, num_samples, sample_dim
            ),
        )
        return BatchData(data, time, latlon_coordinates)

    def latlon_slice(
        self,
        lat_slice: slice,
        lon_slice: slice,
    ) -> "BatchData":
        # This method differs from using HorizontalSubsetDataset because the subsets
        # are specified as index slices rather than coordinate ranges. This is useful
        # for dividing a region into patches.
        sliced_data = {k: v[..., lat_slice, lon_slice] for k, v in self.data.items()}
        sliced_latlon = BatchedLatLonCoordinates(
            lat=self.latlon_coordinates.lat[..., lat_slice],
            lon=self.latlon_coordinates.lon[..., lon_slice],
            dims=self.latlon_coordinates.dims,
        )
        return BatchData(
            data=sliced_data,
            time=self.time,
            latlon_coordinates=sliced_latlon,
        )

    def apply_patch(
        self, patch: Patch, type: Literal["input", "output"]
    ) -> "BatchData":
        if self.is_patched:
            raise ValueError("Patching previously patched data is not supported.")

        use_slice = patch.input_slice if type == "input" else patch.output_slice

        data = self.latlon_slice(lat_slice=use_slice.y, lon_slice=use_slice.x)
        data.is_patched = True
        return data

    def generate_from_patches(
        self, patches: list[Patch], patch_type: Literal["input", "output"] = "input"
    ) -> Iterator["BatchData"]:
        for patch in patches:
            yield self.apply_patch(patch, patch_type)


@dataclasses.dataclass
class PairedBatchData:
    fine: BatchData
    coarse: BatchData

    def _validated_scale_factor(self):
        fine = self.fine.horizontal_shape
        coarse = self.coarse.horizontal_shape

        if fine[0] // coarse[0] != fine[1] // coarse[1]:
            raise ValueError(
                "Fine and coarse datasets must have the same scale factor "
                f"between lat and lon dimensions. Got fine {fine} and coarse {coarse}"
            )
        if fine[0] % coarse[0] != 0 or fine[1] % coarse[1] != 0:
            raise ValueError(
                "Fine and coarse horizontal dimensions must be evenly divisible."
                f" Got fine {fine} and coarse {coarse}"
            )

        return fine[0] // coarse[0]

    def _validate(self):
        if not len(self.fine) == len(self.coarse):
            raise ValueError("Batch must have the same number of items.")
        self.downscale_factor = self._validated_scale_factor()

    def __post_init__(self):
        self._validate()

    def to_device(self) -> "PairedBatchData":
        return PairedBatchData(self.fine.to_device(), self.coarse.to_device())

    def __getitem__(self, k):
        return PairedBatchItem(self.fine[k], self.coarse[k])

    def __len__(self):
        return len(self.fine)

    def latlon_slice(
        self,
        coarse_lat_slice: slice,
        coarse_lon_slice: slice,
        fine_lat_slice: slice,
        fine_lon_slice: slice,
    ):
        return PairedBatchData(
            fine=self.fine.latlon_slice(fine_lat_slice, fine_lon_slice),
            coarse=self.coarse.latlon_slice(coarse_lat_slice, coarse_lon_slice),
        )

    @classmethod
    def from_sequence(
        cls,
        items: Sequence[PairedBatchItem],
    ) -> Self:
        fine, coarse = zip(*items)
        return cls(BatchData.from_sequence(fine), BatchData.from_sequence(coarse))

    def expand_and_fold(self, num_samples, sample_dim, dim_name="sample"):
        fine = self.fine.expand_and_fold(num_samples, sample_dim, dim_name)
        coarse = self.coarse.expand_and_fold(num_samples, sample_dim, dim_name)
        return PairedBatchData(fine, coarse)

    def generate_from_patches(
        self,
        coarse_patches: list[Patch],
        fine_patches: list[Patch],
    ) -> Iterator["PairedBatchData"]:
        coarse_gen = self.coarse.generate_from_patches(coarse_patches)
        fine_gen = self.fine.generate_from_patches(fine_patches)

        for coarse_batch, fine_batch in zip(coarse_gen, fine_gen):
            yield PairedBatchData(fine=fine_batch, coarse=coarse_batch)


# Video (temporal) data containers: clips of ``T`` frames with an explicit
# leading time axis and per-frame physical-time features.


@dataclasses.dataclass
class VideoBatchItem:
    """A single downscaling video clip (each field ``(T, lat, lon)``)."""

    data: TensorMapping
    time: xr.DataArray
    latlon_coordinates: LatLonCoordinates
    day_of_year: torch.Tensor
    second_of_day: torch.Tensor

    def _validate(self):
        n_times: int | None = None
        for key, value in self.data.items():
            if value.dim() != 3:
                raise ValueError(
                    f"Expected 3D (time, lat, lon) data, got shape {value.shape} "
                    f"({key})"
                )
            if n_times is None:
                n_times = value.shape[0]
            elif value.shape[0] != n_times:
                raise ValueError(
                    "All variables must have the same number of frames, got "
                    f"{value.shape[0]} and {n_times}."
                )
        if n_times is None:
            raise ValueError("VideoBatchItem must have at least one variable.")
        if self.time.shape != (n_times,):
            raise ValueError(
                f"Expected time of shape ({n_times},), got {self.time.shape}"
            )
        for name, feature in (
            ("day_of_year", self.day_of_year),
            ("second_of_day", self.second_of_day),
        ):
            if feature.shape != (n_times,):
                raise ValueError(
                    f"Expected {name} of shape ({n_times},), got "
                    f"{tuple(feature.shape)}"
                )
        if self.latlon_coordinates.lat.dim() != 1:
            raise ValueError(
                "Expected 1D lat coordinates, got shape "
                f"{self.latlon_coordinates.lat.shape}"
            )
        if self.latlon_coordinates.lon.dim() != 1:
            raise ValueError(
                "Expected 1D lon coordinates, got shape "
                f"{self.latlon_coordinates.lon.shape}"
            )
        return n_times

    def __post_init__(self):
        self._n_times = self._validate()
        self._horizontal_shape = next(iter(self.data.values())).shape[-2:]

    @property
    def n_times(self) -> int:
        return self._n_times

    @property
    def horizontal_shape(self) -> tuple[int, int]:
        return self._horizontal_shape

    def __iter__(self):
        return iter(
            [
                self.data,
                self.time,
                self.latlon_coordinates,
                self.day_of_year,
                self.second_of_day,
            ]
        )

    def to_device(self) -> "VideoBatchItem":
        device = get_device()
        device_latlon = LatLonCoordinates(
            lat=self.latlon_coordinates.lat.to(device),
            lon=self.latlon_coordinates.lon.to(device),
        )
        return VideoBatchItem(
            move_tensordict_to_device(self.data),
            self.time,
            device_latlon,
            self.day_of_year.to(device),
            self.second_of_day.to(device),
        )


class VideoBatchItemDatasetAdapter(torch.utils.data.Dataset):
    """Adapts a multi-timestep dataset to return a ``VideoBatchItem``,
    preserving the time axis and attaching per-frame physical-time features."""

    def __init__(
        self,
        dataset: HorizontalSubsetDataset | XarrayConcat,
        coordinates: LatLonCoordinates,
        properties: DatasetProperties | None = None,
    ):
        self._dataset = dataset
        self._coordinates = coordinates
        self._properties = properties

    def __len__(self):
        return len(self._dataset)

    def __getitem__(self, idx) -> VideoBatchItem:
        fields, time, _, _, missing_names = self._dataset[idx]
        assert (
            missing_names is None
        ), "Variable masking is not supported in downscaling."
        day_of_year, second_of_day = compute_calendar_features(time)
        return VideoBatchItem(
            dict(fields), time, self._coordinates, day_of_year, second_of_day
        )

    @property
    def variable_metadata(self) -> dict[str, VariableMetadata]:
        if self._properties is None:
            raise ValueError("Properties not set for this dataset.")
        return self._properties.variable_metadata


@dataclasses.dataclass
class VideoBatchData:
    """A batch of video clips with leading ``(batch, T, ...)`` dimensions."""

    data: TensorMapping
    time: xr.DataArray
    latlon_coordinates: BatchedLatLonCoordinates
    day_of_year: torch.Tensor
    second_of_day: torch.Tensor

    def __post_init__(self):
        self.is_patched = False

    @classmethod
    def from_sequence(
        cls,
        items: Sequence[VideoBatchItem],
        dim_name: str = "batch",
    ) -> Self:
        data, times, latlon_coordinates, day_of_year, second_of_day = zip(*items)
        return cls(
            torch.utils.data.default_collate(data),
            xr.concat(times, dim_name),
            BatchedLatLonCoordinates.from_sequence(latlon_coordinates),
            torch.stack(day_of_year, dim=0),
            torch.stack(second_of_day, dim=0),
        )

    def to_device(self) -> "VideoBatchData":
        device = get_device()
        return VideoBatchData(
            move_tensordict_to_device(self.data),
            self.time,
            self.latlon_coordinates.to_device(),
            self.day_of_year.to(device),
            self.second_of_day.to(device),
        )

    def __len__(self):
        return self.day_of_year.shape[0]

    @property
    def lat_interval(self) -> ClosedInterval:
        lat = self.latlon_coordinates.lat[0]  # all batch members identical; use first
        return ClosedInterval(lat.min().item(), lat.max().item())

    @property
    def lon_interval(self) -> ClosedInterval:
        lon = self.latlon_coordinates.lon[0]  # all batch members identical; use first
        return ClosedInterval(lon.min().item(), lon.max().item())

    def latlon_slice(self, lat_slice: slice, lon_slice: slice) -> "VideoBatchData":
        # data is (batch, T, H, W); day_of_year/second_of_day/lon-independent
        # calendar features are (batch, T) and unaffected by a spatial slice.
        sliced_data = {k: v[..., lat_slice, lon_slice] for k, v in self.data.items()}
        sliced_latlon = BatchedLatLonCoordinates(
            lat=self.latlon_coordinates.lat[..., lat_slice],
            lon=self.latlon_coordinates.lon[..., lon_slice],
            dims=self.latlon_coordinates.dims,
        )
        return VideoBatchData(
            data=sliced_data,
            time=self.time,
            latlon_coordinates=sliced_latlon,
            day_of_year=self.day_of_year,
            second_of_day=self.second_of_day,
        )

    def apply_patch(
        self, patch: Patch, type: Literal["input", "output"]
    ) -> "VideoBatchData":
        if self.is_patched:
            raise ValueError("Patching previously patched data is not supported.")
        use_slice = patch.input_slice if type == "input" else patch.output_slice
        data = self.latlon_slice(lat_slice=use_slice.y, lon_slice=use_slice.x)
        data.is_patched = True
        return data

    def generate_from_patches(
        self, patches: list[Patch], patch_type: Literal["input", "output"] = "input"
    ) -> Iterator["VideoBatchData"]:
        for patch in patches:
            yield self.apply_patch(patch, patch_type)


class VideoFineCoarsePairedDataset(torch.utils.data.Dataset):
    """Returns a paired fine/coarse ``VideoBatchItem`` from paired datasets."""

    def __init__(
        self,
        fine: VideoBatchItemDatasetAdapter,
        coarse: VideoBatchItemDatasetAdapter,
    ):
        self.fine = fine
        self.coarse = coarse
        if len(self.fine) != len(self.coarse):
            raise ValueError("Datasets must have the same number of items.")

    def __len__(self):
        return len(self.fine)

    def __getitem__(self, idx) -> "PairedVideoBatchItem":
        return PairedVideoBatchItem(self.fine[idx], self.coarse[idx])


def _validated_video_scale_factor(
    fine: tuple[int, int], coarse: tuple[int, int]
) -> int:
    if fine[0] // coarse[0] != fine[1] // coarse[1]:
        raise ValueError(
            "Fine and coarse datasets must have the same scale factor "
            f"between lat and lon dimensions. Got fine {fine} and coarse {coarse}"
        )
    if fine[0] % coarse[0] != 0 or fine[1] % coarse[1] != 0:
        raise ValueError(
            "Fine and coarse horizontal dimensions must be evenly divisible."
            f" Got fine {fine} and coarse {coarse}"
        )
    return fine[0] // coarse[0]


@dataclasses.dataclass
class PairedVideoBatchItem:
    """Container pairing a fine and coarse ``VideoBatchItem``."""

    fine: VideoBatchItem
    coarse: VideoBatchItem

    def _validate(self):
        if self.fine.n_times != self.coarse.n_times:
            raise ValueError("Fine and coarse clips must have the same length.")
        if not (self.fine.time.values == self.coarse.time.values).all():
            raise ValueError("Time must match between fine and coarse items.")
        self.downscale_factor = _validated_video_scale_factor(
            self.fine.horizontal_shape, self.coarse.horizontal_shape
        )

    def __post_init__(self):
        self._validate()

    def to_device(self) -> "PairedVideoBatchItem":
        return PairedVideoBatchItem(self.fine.to_device(), self.coarse.to_device())

    def __iter__(self):
        return iter([self.fine, self.coarse])


@dataclasses.dataclass
class PairedVideoBatchData:
    """A batch of paired fine/coarse video clips."""

    fine: VideoBatchData
    coarse: VideoBatchData

    @classmethod
    def from_sequence(cls, items: Sequence[PairedVideoBatchItem]) -> Self:
        fine, coarse = zip(*items)
        return cls(
            VideoBatchData.from_sequence(fine),
            VideoBatchData.from_sequence(coarse),
        )

    def to_device(self) -> "PairedVideoBatchData":
        return PairedVideoBatchData(self.fine.to_device(), self.coarse.to_device())

    def __len__(self):
        return len(self.fine)

    def generate_from_patches(
        self,
        coarse_patches: list[Patch],
        fine_patches: list[Patch],
    ) -> Iterator["PairedVideoBatchData"]:
        coarse_gen = self.coarse.generate_from_patches(coarse_patches)
        fine_gen = self.fine.generate_from_patches(fine_patches)
        for coarse_batch, fine_batch in zip(coarse_gen, fine_gen):
            yield PairedVideoBatchData(fine=fine_batch, coarse=coarse_batch)


@dataclasses.dataclass
class PairedVideoGriddedData:
    """Loader wrapper analogous to ``PairedGriddedData`` for video clips."""

    _loader: torch.utils.data.DataLoader
    coarse_shape: tuple[int, int]
    downscale_factor: int
    n_timesteps: int
    dims: list[str]
    variable_metadata: Mapping[str, VariableMetadata]
    all_times: xr.CFTimeIndex
    fine_coords: LatLonCoordinates

    @property
    def loader(self) -> DataLoader[PairedVideoBatchData]:
        def on_device(batch: PairedVideoBatchData) -> PairedVideoBatchData:
            return batch.to_device()

        return SizedMap(on_device, self._loader)

    def get_generator(self) -> Iterator["PairedVideoBatchData"]:
        yield from self.loader

    def get_patched_generator(
        self,
        coarse_yx_patch_extent: tuple[int, int],
        overlap: int = 0,
        drop_partial_patches: bool = True,
        random_offset: bool = False,
        shuffle: bool = False,
        region_sampling: "RegionSamplingConfig | None" = None,
    ) -> Iterator["PairedVideoBatchData"]:
        patched_generator = patched_batch_gen_from_paired_video_loader(
            self.loader,
            coarse_yx_extent=self.coarse_shape,
            coarse_yx_patch_extent=coarse_yx_patch_extent,
            downscale_factor=self.downscale_factor,
            coarse_overlap=overlap,
            drop_partial_patches=drop_partial_patches,
            random_offset=random_offset,
            shuffle=shuffle,
            region_sampling=region_sampling,
        )
        return cast(
            Iterator[PairedVideoBatchData],
            patched_generator,
        )


class ContiguousDistributedSampler(DistributedSampler):
    """Distributes contiguous chunks of data across ranks.
    This is useful when we desire generated chunks to be contiguous
    in time, for example generating new datasets for downstream training.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, drop_last: bool = False):
        super().__init__(
            dataset,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=False,
            drop_last=drop_last,
        )

        # If the dataset length is evenly divisible by # of replicas, then there
        # is no need to drop any data, since the dataset will be split equally.
        if self.drop_last and len(self.dataset) % self.num_replicas != 0:  # type: ignore[arg-type]
            # Split to nearest available length that is evenly divisible.
            # This is to ensure each rank receives the same amount of data when
            # using this Sampler.
            self.num_samples = math.ceil(
                (len(self.dataset) - self.num_replicas) / self.num_replicas  # type: ignore[arg-type]
            )
        else:
            self.num_samples = math.ceil(len(self.dataset) / self.num_replicas)  # type: ignore[arg-type]
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        # Deterministically split data into contiguous chunks
        indices = list(range(len(self.dataset)))

        if self.drop_last:
            # remove tail of data to make it evenly divisible.
            indices = indices[: self.total_size]

        # Subsample contiguous chunk for this rank
        total_size = len(indices)
        chunk_size = total_size // self.num_replicas
        start = self.rank * chunk_size
        end = start + chunk_size if self.rank != self.num_replicas - 1 else total_size

        return iter(indices[start:end])


@dataclasses.dataclass
class RegionSamplingConfig:
    """
    Configures weighted sampling of training patches whose center falls
    within the specified lat/lon region.

    The total number of patches yielded per batch remains the same as
    without sampling a region. Patches are drawn with replacement from
    a weighted distribution where patches inside the region have relative
    weight ``weight`` and patches outside have weight 1.

    Parameters:
        lat_interval: Latitude range [start, stop] in degrees defining
            the oversampled region. If None, all latitudes match.
        lon_interval: Longitude range [start, stop] in degrees defining
            the oversampled region. If None, all longitudes match.
        weight: Relative sampling weight for patches inside the
            region. Must be > 0. A value of 1 gives uniform sampling
            (no oversampling).
    """

    lat_interval: ClosedInterval | None = None
    lon_interval: ClosedInterval | None = None
    weight: float = 1.0

    def __post_init__(self):
        if self.weight <= 0:
            raise ValueError(f"weight must be > 0, got {self.weight}.")

    def get_weight(self, lat: float, lon: float) -> float:
        lat_match = self.lat_interval is None or lat in self.lat_interval
        lon_match = self.lon_interval is None or lon in self.lon_interval
        return self.weight if lat_match and lon_match else 1.0


def _sample_indices_with_region_sampling(
    coarse_patches: list[Patch],
    coarse_lats: torch.Tensor,
    coarse_lons: torch.Tensor,
    config: RegionSamplingConfig,
) -> list[int]:
    """
    Return a list of ``len(coarse_patches)`` patch indices sampled with
    replacement from a weighted distribution.  Patches whose center
    falls within the configured region receive weight
    ``config.weight``; other patches receive weight 1.

    ``coarse_lats`` and ``coarse_lons`` are 1-D tensors of the coarse
    latitude and longitude coordinates that each patch's
    ``input_slice`` indexes into.
    """
    weights: list[float] = []
    for patch in coarse_patches:
        center_lat = float(coarse_lats[patch.input_slice.y].mean().item())
        center_lon = float(coarse_lons[patch.input_slice.x].mean().item())
        weights.append(config.get_weight(center_lat, center_lon))
    return random.choices(
        range(len(coarse_patches)), weights=weights, k=len(coarse_patches)
    )


# downscale_factor=None means fine patches not needed here, but reusing
# _get_paired_patches in both paired and no-target cases to share the
# coincident offset logic.
def _get_paired_patches(
    coarse_yx_extent: tuple[int, int],
    coarse_yx_patch_extent: tuple[int, int],
    coarse_overlap: int,
    downscale_factor: int | None,
    random_offset: bool = False,
    shuffle: bool = False,
    drop_partial_patches: bool = True,
) -> tuple[list[Patch], list[Patch] | None]:
    coarse_y_offset = get_offset(
        random_offset, coarse_yx_extent[0], coarse_yx_patch_extent[0]
    )
    coarse_x_offset = get_offset(
        random_offset, coarse_yx_extent[1], coarse_yx_patch_extent[1]
    )
    coarse_patches = get_patches(
        yx_extent=coarse_yx_extent,
        yx_patch_extent=coarse_yx_patch_extent,
        overlap=coarse_overlap,
        drop_partial_patches=drop_partial_patches,
        y_offset=coarse_y_offset,
        x_offset=coarse_x_offset,
    )
    if downscale_factor is not None:
        fine_yx_extent = scale_tuple(coarse_yx_extent, downscale_factor)
        fine_yx_patch_extent = scale_tuple(coarse_yx_patch_extent, downscale_factor)
        fine_patches = get_patches(
            yx_extent=fine_yx_extent,
            yx_patch_extent=fine_yx_patch_extent,
            overlap=coarse_overlap * downscale_factor,
            drop_partial_patches=drop_partial_patches,
            y_offset=coarse_y_offset * downscale_factor,
            x_offset=coarse_x_offset * downscale_factor,
        )
        if shuffle:
            # Shuffling is only relevant for training, which is over paired data
            coarse_patches, fine_patches = paired_shuffle(coarse_patches, fine_patches)
    else:
        fine_patches = None
    return coarse_patches, fine_patches


def patched_batch_gen_from_loader(
    loader: DataLoader[BatchItem],
    coarse_yx_extent: tuple[int, int],
    coarse_yx_patch_extent: tuple[int, int],
    coarse_overlap: int = 0,
    drop_partial_patches: bool = True,
    random_offset: bool = False,
    shuffle: bool = False,
) -> Iterator[BatchData]:
    for batch in loader:
        coarse_patches, _ = _get_paired_patches(
            coarse_yx_extent=coarse_yx_extent,
            coarse_yx_patch_extent=coarse_yx_patch_extent,
            coarse_overlap=coarse_overlap,
            downscale_factor=None,
            random_offset=random_offset,
            shuffle=shuffle,
            drop_partial_patches=drop_partial_patches,
        )
        yield from batch.generate_from_patches(coarse_patches)


def patched_batch_gen_from_paired_loader(
    loader: DataLoader[PairedBatchItem],
    coarse_yx_extent: tuple[int, int],
    coarse_yx_patch_extent: tuple[int, int],
    downscale_factor: int,
    coarse_overlap: int = 0,
    drop_partial_patches: bool = True,
    random_offset: bool = False,
    shuffle: bool = False,
    region_sampling: RegionSamplingConfig | None = None,
) -> Iterator[PairedBatchData]:
    for batch in loader:
        coarse_patches, fine_patches = _get_paired_patches(
            coarse_yx_extent=coarse_yx_extent,
            coarse_yx_patch_extent=coarse_yx_patch_extent,
            coarse_overlap=coarse_overlap,
            downscale_factor=downscale_factor,
            random_offset=random_offset,
            shuffle=shuffle,
            drop_partial_patches=drop_partial_patches,
        )
        if region_sampling is not None:
            assert fine_patches is not None  # for type checking
            coarse_lats = batch.coarse.latlon_coordinates.lat[
                0
            ]  # dims are [batch, lat/lon]
            coarse_lons = batch.coarse.latlon_coordinates.lon[0]
            indices = _sample_indices_with_region_sampling(
                coarse_patches, coarse_lats, coarse_lons, region_sampling
            )
            coarse_patches = [coarse_patches[i] for i in indices]
            fine_patches = [fine_patches[i] for i in indices]
        yield from batch.generate_from_patches(coarse_patches, fine_patches)


def patched_batch_gen_from_paired_video_loader(
    loader: DataLoader[PairedVideoBatchData],
    coarse_yx_extent: tuple[int, int],
    coarse_yx_patch_extent: tuple[int, int],
    downscale_factor: int,
    coarse_overlap: int = 0,
    drop_partial_patches: bool = True,
    random_offset: bool = False,
    shuffle: bool = False,
    region_sampling: RegionSamplingConfig | None = None,
) -> Iterator[PairedVideoBatchData]:
    """Video analog of ``patched_batch_gen_from_paired_loader``: each loaded
    (batch, T, H, W) clip batch is carved into multiple smaller-domain clip
    batches in memory (the time axis is untouched by patching).
    """
    for batch in loader:
        coarse_patches, fine_patches = _get_paired_patches(
            coarse_yx_extent=coarse_yx_extent,
            coarse_yx_patch_extent=coarse_yx_patch_extent,
            coarse_overlap=coarse_overlap,
            downscale_factor=downscale_factor,
            random_offset=random_offset,
            shuffle=shuffle,
            drop_partial_patches=drop_partial_patches,
        )
        if region_sampling is not None:
            assert fine_patches is not None  # for type checking
            coarse_lats = batch.coarse.latlon_coordinates.lat[
                0
            ]  # dims are [batch, lat/lon]
            coarse_lons = batch.coarse.latlon_coordinates.lon[0]
            indices = _sample_indices_with_region_sampling(
                coarse_patches, coarse_lats, coarse_lons, region_sampling
            )
            coarse_patches = [coarse_patches[i] for i in indices]
            fine_patches = [fine_patches[i] for i in indices]
        yield from batch.generate_from_patches(coarse_patches, fine_patches)
